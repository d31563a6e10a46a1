"""Writing a merge: shards, side files, the model card, output checks, placement and what was written."""
