"""Facts about the machine this runs on, each read by one small module under a `root` for testability."""
