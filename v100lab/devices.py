"""The hardware catalog and the measured host.

Devices are data, not code: ``v100lab/data/devices.yaml`` holds one row per card or chip, each with its
source URL and with units in the key names (``memory_gib``, ``bandwidth_gbs``, ...). ``get_device``
accepts a catalog id, a YAML/JSON file with the same fields (for a card the catalog lacks, or a Mac with
less memory than the catalog's largest configuration), or ``"host"`` — this machine's CPU, which is
*measured*, never typed: :func:`v100lab.calibration.measure_host` measures RAM size and memory bandwidth
and stores them as ``host-profile.json`` in the v100lab cache directory, which this module reads and
writes; other tools (``v100lab calibrate``) may add fields to that file, and those are kept
(``Device.extra``). Reading a device never measures anything.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import socket
import tempfile
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import psutil
import yaml

from v100lab.errors import DeviceError
from v100lab.safeio import cache_dir, load_yaml, read_json_dict, read_text_bounded, short_repr

log = logging.getLogger(__name__)

KINDS = ("gpu", "cpu", "apple")
HOST_ID = "host"
HOST_PROFILE = "host-profile.json"
_CATALOG_FILE = "devices.yaml"
# fields a device row must have; the rest default to None
_REQUIRED = ("id", "name", "kind", "memory_gib", "bandwidth_gbs")
MAX_DEVICE_FILE_BYTES = 1 << 20
# (lowest, highest) for each number; far beyond any machine built, so only typos and hostile values
# fail (NaN, infinities, 1e300, 10**400 are refused, not carried into the predictions)
_RANGES = {
    "memory_gib": (2**-10, 1 << 20),       # 1 MiB .. 1 PiB
    "bandwidth_gbs": (1e-3, 1e6),          # 1 MB/s .. 1 PB/s
    "fp16_tflops": (0.0, 1e6),
    "fp32_tflops": (0.0, 1e6),
    "host_link_gbs": (0.0, 1e5),
    "runtime_overhead_mib": (0.0, float(1 << 30)),
    "board_power_w": (0.0, 1e6),
}
_POSITIVE = ("memory_gib", "bandwidth_gbs")   # required, and at least their lowest value
MAX_TEXT_CHARS = 200
# The host's read bandwidth until it is measured: an assumption of the order of a desktop's dual-channel
# DDR4, stated in the device's name and replaced by the measured figure once the profile exists.
UNMEASURED_HOST_BANDWIDTH_GBS = 20.0


@dataclass(frozen=True)
class Device:
    """One device llama.cpp can put tensors on. Units are in the field names."""

    id: str
    name: str
    kind: str                          # gpu | cpu | apple
    memory_gib: float                  # memory size (GiB = 2^30 bytes)
    bandwidth_gbs: float               # peak memory bandwidth (GB/s = 10^9 bytes/s); measured for the host
    fp16_tflops: float | None = None   # peak dense FP16 (tensor cores where present)
    compute_capability: str | None = None
    host_link_gbs: float | None = None  # PCIe per direction; None for unified memory / the host itself
    runtime_overhead_mib: float = 0.0   # lost before llama.cpp allocates: CUDA context, cuBLAS, reserved
    source_url: str = ""
    fp32_tflops: float | None = None
    board_power_w: float | None = None  # the board's power limit (TDP), vendor figure; caps prompt speed
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self):
        for name in ("id", "name"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v.strip() or len(v) > MAX_TEXT_CHARS:
                raise DeviceError(f"device {name} must be a non-empty string of at most {MAX_TEXT_CHARS} "
                                  f"characters, got {_short_repr(v)}")
        if self.kind not in KINDS:
            raise DeviceError(f"device '{self.id}': kind must be one of {', '.join(KINDS)}, got {_short_repr(self.kind)}")
        for name, (low, high) in _RANGES.items():
            v = getattr(self, name)
            if v is None and name not in _POSITIVE:
                continue
            ok = not isinstance(v, bool) and isinstance(v, (int, float)) and _in_range(v, low, high)
            if not ok:
                raise DeviceError(f"device '{self.id}': {name} must be a finite number in [{low:g}, {high:g}], "
                                  f"got {_short_repr(v)}")
        if not isinstance(self.source_url, str):
            raise DeviceError(f"device '{self.id}': source_url must be a string, got {_short_repr(self.source_url)}")
        if not isinstance(self.extra, MappingProxyType):
            object.__setattr__(self, "extra", MappingProxyType(dict(self.extra)))

    @property
    def capacity_bytes(self) -> int:
        """Total memory in bytes (before the runtime overhead is taken off)."""
        return int(round(self.memory_gib * 2**30))

    @property
    def overhead_bytes(self) -> int:
        return int(round((self.runtime_overhead_mib or 0) * 2**20))

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return float(self.bandwidth_gbs) * 1e9

    @property
    def is_host(self) -> bool:
        return self.kind == "cpu"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        extra = dict(d.pop("extra") or {})
        d.update(extra)
        return d


_FIELD_NAMES = tuple(f.name for f in fields(Device) if f.name != "extra")


def _in_range(v: int | float, low: float, high: float) -> bool:
    """Whether ``v`` is finite and within [low, high], without converting a huge int to float first
    (10**400 would overflow)."""
    if isinstance(v, float) and not math.isfinite(v):
        return False
    return low <= v <= high


def _short_repr(v) -> str:
    return short_repr(v, limit=60)


def device_from_mapping(data: Mapping[str, Any], where: str, keep_extra: bool = False) -> Device:
    """Build a Device from a catalog row or a device file; unknown keys are an error unless kept."""
    if not isinstance(data, Mapping):
        raise DeviceError(f"{where}: a device must be a mapping of fields, got {type(data).__name__}")
    missing = [k for k in _REQUIRED if data.get(k) is None]
    if missing:
        raise DeviceError(f"{where}: device is missing field(s) {', '.join(missing)}")
    known = {k: v for k, v in data.items() if k in _FIELD_NAMES}
    unknown = {k: v for k, v in data.items() if k not in _FIELD_NAMES}
    if unknown and not keep_extra:
        raise DeviceError(f"{where}: unknown device field(s) {', '.join(sorted(map(str, unknown)))} "
                          f"(known: {', '.join(_FIELD_NAMES)})")
    if known.get("compute_capability") is not None:
        cc = known["compute_capability"]
        if isinstance(cc, bool) or not isinstance(cc, (str, int, float)) or len(str(cc)) > 16:
            raise DeviceError(f"{where}: compute_capability must be a version such as \"7.0\", got {_short_repr(cc)}")
        known["compute_capability"] = str(cc)
    if known.get("runtime_overhead_mib") is None:
        known["runtime_overhead_mib"] = 0.0
    if isinstance(known["id"], (int, float)) and not isinstance(known["id"], bool):
        known["id"] = str(known["id"])
    if known.get("source_url") is None:
        known["source_url"] = ""
    try:
        return Device(**known, extra=unknown)
    except TypeError as exc:
        raise DeviceError(f"{where}: {exc}") from None


@lru_cache(maxsize=1)
def _catalog() -> tuple[Device, ...]:
    text = resources.files("v100lab").joinpath("data", _CATALOG_FILE).read_text()
    rows = yaml.safe_load(text)["devices"]
    out = []
    seen = set()
    for i, row in enumerate(rows):
        dev = device_from_mapping(row, f"{_CATALOG_FILE} row {i}")
        if dev.id in seen:
            raise DeviceError(f"{_CATALOG_FILE}: duplicate device id '{dev.id}'")
        if not dev.source_url:
            raise DeviceError(f"{_CATALOG_FILE}: device '{dev.id}' has no source_url")
        seen.add(dev.id)
        out.append(dev)
    return tuple(out)


def catalog() -> dict[str, Device]:
    """Every catalog device by id (the host is not in it: it is measured, see :func:`host_device`)."""
    return {d.id: d for d in _catalog()}


def get_device(id_or_path: str | os.PathLike | Device) -> Device:
    """A catalog id, ``"host"`` (the stored host profile: :func:`host_device`), or a YAML/JSON file with a
    device's fields."""
    if isinstance(id_or_path, Device):
        return id_or_path
    key = str(id_or_path)
    if key == HOST_ID:
        return host_device()
    cat = catalog()
    if key in cat:
        return cat[key]
    low = key.lower()
    if low in cat:
        return cat[low]
    path = Path(key).expanduser()
    if path.suffix.lower() in (".yaml", ".yml", ".json") or path.is_file():
        return load_device_file(path)
    raise DeviceError(f"unknown device '{key}' (known: {HOST_ID}, {', '.join(cat)}; or a .yaml/.json device file)")


def load_device_file(path: str | os.PathLike) -> Device:
    """A device described in a YAML or JSON file with the catalog's fields (a single mapping,
    or ``devices: [one row]``)."""
    path = Path(path)
    text = read_text_bounded(path, MAX_DEVICE_FILE_BYTES, what="device file", error=DeviceError)
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else load_yaml(text)
    except (ValueError, yaml.YAMLError, RecursionError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise DeviceError(f"device file {path}: not valid {'JSON' if path.suffix.lower() == '.json' else 'YAML'}: "
                          f"{first}") from None
    if isinstance(data, Mapping) and "devices" in data:
        rows = data["devices"]
        if not isinstance(rows, list) or len(rows) != 1:
            raise DeviceError(f"device file {path}: 'devices' must hold exactly one device")
        data = rows[0]
    if isinstance(data, Mapping) and "id" not in data:
        data = {**data, "id": path.stem}
    return device_from_mapping(data, f"device file {path}")


# ------------------------------------------------------------------------------------------------
# the host: the stored profile (measured by v100lab.calibration)
# ------------------------------------------------------------------------------------------------

def host_profile_path() -> Path:
    return cache_dir() / HOST_PROFILE


def host_fingerprint() -> dict[str, Any]:
    """What identifies this machine in a stored host profile (a profile copied from elsewhere is ignored)."""
    return {"hostname": socket.gethostname(), "cpu_count": os.cpu_count() or 1,
            "ram_bytes": int(psutil.virtual_memory().total), "machine": platform.machine()}


def read_host_profile() -> dict[str, Any] | None:
    """The cached host profile as a dict (all fields, also those other tools added), or None."""
    return read_json_dict(host_profile_path(), "host profile")


def write_host_profile(updates: Mapping[str, Any]) -> Path:
    """Merge ``updates`` into the cached host profile (atomically); unknown fields are kept.

    ``v100lab calibrate`` uses this to add its calibration next to the measured bandwidth."""
    path = host_profile_path()
    data = read_host_profile() or {}
    data.update(updates)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _profile_of_this_host() -> dict[str, Any] | None:
    """The stored host profile when it was measured on this machine and is complete, else None."""
    profile = read_host_profile()
    if profile is None:
        return None
    fp = profile.get("fingerprint") or {}
    now = host_fingerprint()
    if any(fp.get(k) != now[k] for k in ("hostname", "cpu_count", "ram_bytes")) or "bandwidth_gbs" not in profile:
        log.info("host profile %s was measured elsewhere or is incomplete; ignored", host_profile_path())
        return None
    return profile


def host_measured() -> bool:
    """Whether this machine has a stored, complete host profile (``v100lab calibrate`` writes one)."""
    return _profile_of_this_host() is not None


def host_device() -> Device:
    """This machine's CPU as a Device, from the stored host profile; reading it measures nothing.

    Without a profile measured on this machine: the host's facts (RAM size, core count, CPU name) with
    :data:`UNMEASURED_HOST_BANDWIDTH_GBS` as an assumed bandwidth, marked ``extra["measured"] = False``.
    Measuring is explicit: :func:`v100lab.calibration.measure_host` (or ``v100lab calibrate``)."""
    profile = _profile_of_this_host()
    if profile is not None:
        return device_from_mapping(profile, f"host profile {host_profile_path()}", keep_extra=True)
    fp = host_fingerprint()
    return Device(id=HOST_ID, name=f"host CPU: {cpu_name()} ({fp['cpu_count']} threads; bandwidth not measured)",
                  kind="cpu", memory_gib=round(fp["ram_bytes"] / 2**30, 3), bandwidth_gbs=UNMEASURED_HOST_BANDWIDTH_GBS,
                  source_url="not measured: run `v100lab calibrate` (or v100lab.calibration.measure_host)",
                  extra={"measured": False, "fingerprint": fp})
