"""The `asyncgrpo` command: validate, render and run job files."""
