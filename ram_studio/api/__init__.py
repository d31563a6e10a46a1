"""The Python API's modules, one per call (analyze, merge, evaluate, sweep, and the demo's toy and Fig. 3), with
what they share: keywords to the CLI's options (options), progress (progress), display (display), the app's
figures (figures). Use them through `ram_studio`: `from ram_studio import analyze, merge, evaluate, sweep`."""
