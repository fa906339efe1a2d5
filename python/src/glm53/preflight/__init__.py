"""The doctor: checks across the layers (host facts, the checkpoint, the profile's needs, the recipe's pins)
before a start, and the host audit against the validated hardware."""
