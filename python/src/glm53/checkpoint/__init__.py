"""The checkpoint: lock, the Hub (its API and the download), hashing, verify, the index repair, safetensors headers,
model spec."""
