"""The size presets (`configs/presets/*.yaml`) and the nanotron base config (`configs/nanotron-0.4-base.yaml`):
data, read here."""

from __future__ import annotations

from pathlib import Path

import yaml

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONFIGS_DIR = PROJECT_ROOT / "configs"
PRESETS_DIR = CONFIGS_DIR / "presets"
BASE_CONFIG = CONFIGS_DIR / "nanotron-0.4-base.yaml"
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where PyYAML has it: 10x faster


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def load_preset(name: str) -> dict:
    with open(PRESETS_DIR / f"{name}.yaml", encoding="utf-8") as f:
        return yaml.load(f, Loader=YAML_LOADER)
