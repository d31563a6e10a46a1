"""RAM Studio's command line (`ram-studio`, also `python -m ram_studio` and `python -m merging`): the top
layer, which may use every package below it (analysis, merging) and the bundled demo (assets)."""
