"""The checkpoint: lock, Hub download, hashing, verify, the index repair, safetensors headers, model spec."""
