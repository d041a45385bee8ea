"""A knob that names the config file one `train_mode` value trains (peft_config for `peft`,
lycoris_config for `lycoris`): read when a probe runs, from the path as given; asked for, in a
line, when that value is chosen without it; never read under another value."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from autofit.devices import nvidia_device_visible
from autofit.errors import ConfigError
from autofit.knobs.base import Knob, ProbeContext
from autofit.models import ModelPreset


class AdapterFileKnob(Knob):
    default = None
    kind = str
    names_a_file = True
    per_sample_memory = False  # what it changes per sample, train_mode says
    # train_mode's apply reads it (the adapters are built there).
    mode: ClassVar[str]  # the train_mode value that trains the file
    what: ClassVar[str]  # the kind of file, for messages: "a PEFT adapter config"
    trains: ClassVar[
        str
    ]  # what the mode trains, for messages: "the adapters a PEFT config declares"
    example: ClassVar[str]  # a file name, for messages: "adapter_config.json"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.default_means = f"none (train_mode={cls.mode} asks for one)"

    def describe(self) -> str:
        return f"a path to {self.what}"

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return config.get("train_mode", "full") == self.mode

    def parse(self, value: Any) -> Any:
        if value is None or isinstance(value, str) and value:
            return value
        raise ConfigError(f"{self.name}={value!r} is not valid; expected a path to {self.what}")

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if not self.applies(context.knobs, context.model):
            return None
        if value is None:
            return (
                f"train_mode={self.mode} trains {self.trains}: give it as "
                f"{self.name}=path/to/{self.example}"
            )
        return self.file_reason(value, context)

    def file_reason(self, value: str, context: ProbeContext) -> str | None:
        """Why the named file cannot run in this probe, in a line (it is read here), or None."""
        return None


def simulated(backend: str) -> bool:
    """Whether the probe runs on fake tensors: simulate, or auto where no GPU is visible."""
    return backend == "simulate" or backend == "auto" and not nvidia_device_visible()


def read_json(setting: str, path: Path, what: str) -> Any:
    """A config file's JSON, or a ConfigError naming `setting` (`name=value`) and what is wrong,
    in a line: no such file (`what` it should be, relative to the working folder), or not JSON."""
    if not path.is_file():
        raise ConfigError(f"{setting}: no such file ({what}, relative to {Path.cwd()})")
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{setting}: not a JSON file ({exc})") from None
