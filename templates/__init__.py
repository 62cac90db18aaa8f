"""Templates shipped with the package."""
