"""The on-disk formats: the sweep spec, the run folder, profiles."""
