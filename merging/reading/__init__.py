"""Reading models: references, the Hub, model folders, safetensors headers, checkpoints, chunked reads."""
