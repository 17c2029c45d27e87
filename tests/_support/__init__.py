"""Builders the tests share, imported as `_support.<module>` (`tests` is on pytest's pythonpath).

- `models`: tiny random VLMs of every family (`build_tiny_vlm`, `save_tiny_vlm`), the bare tiny
  LLaVA of the draft tests (`build_tiny_llava`, `tiny_prompts`), the saved LLaVA checkpoint of
  the latency tests (`save_tiny_llava`), `tiny_image` and `PROMPTS`;
- `processing`: the in-memory tokenizer, chat template and processor behind those models;
- `drafts`: tiny DREAM drafts and the target-side tensors of a prompt;
- `drafter_contract`: the contract suite every drafter meets;
- `latency`: `ToyBuilder`, a real (small) step builder for the profiler tests;
- `search`: the deterministic fake scorer and latency model of the search tests, and a latency
  predictor fitted on synthetic timings;
- `search_worker`: a search worker process (`python -m _support.search_worker CONFIG.json`);
- `postgres`: a throw-away PostgreSQL server;
- `nvml`: a fake `pynvml` and a fake CUDA view (GPUs, MIG slices, power caps) for the
  hardware-identity tests;
- `checkpoints`: tiny checkpoints of every family saved to disk, with the processor
  substituted where the real one needs torchvision.
"""
