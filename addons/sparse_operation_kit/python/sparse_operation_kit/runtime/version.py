"""The package version: read by __init__.py and tools/pip_package/setup.py (one place), and
TensorFlow's version as NVIDIA SOK 2.x gives it (`sok.tf_version`)."""
import re

__version__ = "0.1.0"


def parse_tf_version(text: str) -> list[int]:
    """"2.21.0" -> [2, 21, 0]; suffixes ("2.22.0-rc1", "2.21.0.dev20250101") are left out, so
    `sok.tf_version[0] == 2` and `sok.tf_version[1] >= 17` compare numbers, as in SOK 2.x."""
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        raise ValueError(f"cannot read TensorFlow's version {text!r} (expected 'major.minor.patch')")
    return [int(part or 0) for part in match.groups()]
