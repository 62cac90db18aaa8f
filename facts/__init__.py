"""Facts that read what a GPU node really has."""
