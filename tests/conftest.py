"""Test-wide settings: offline, W&B disabled, few threads (CI machines have 2 cores)."""

import os

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

torch.set_num_threads(min(2, torch.get_num_threads()))
