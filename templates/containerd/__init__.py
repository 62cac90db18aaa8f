"""containerd drop-in templates."""
