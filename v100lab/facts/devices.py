"""The hardware catalog and the measured host.

Devices are data, not code: ``v100lab/data/devices.yaml`` holds one row per card or chip, each with its
source URL and with units in the key names (``memory_gib``, ``bandwidth_gbs``, ...). ``get_device``
accepts a catalog id, a YAML/JSON file with the same fields (for a card the catalog lacks, or a Mac with
less memory than the catalog's largest configuration), or ``"host"`` — this machine's CPU, which is
*measured*, never typed: :func:`v100lab.measure.calibration.measure_host` measures RAM size and memory bandwidth
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
from dataclasses import asdict, dataclass, field, fields, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import psutil
import yaml

from v100lab.base.errors import DeviceError
from v100lab.base.safeio import cache_dir, read_json_dict, read_text_bounded, load_yaml, short_repr

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
# the host: the stored profile (measured by v100lab.measure.calibration)
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
    Measuring is explicit: :func:`v100lab.measure.calibration.measure_host` (or ``v100lab calibrate``)."""
    profile = _profile_of_this_host()
    if profile is not None:
        return device_from_mapping(profile, f"host profile {host_profile_path()}", keep_extra=True)
    fp = host_fingerprint()
    return Device(id=HOST_ID, name=f"host CPU: {cpu_name()} ({fp['cpu_count']} threads; bandwidth not measured)",
                  kind="cpu", memory_gib=round(fp["ram_bytes"] / 2**30, 3), bandwidth_gbs=UNMEASURED_HOST_BANDWIDTH_GBS,
                  source_url="not measured: run `v100lab calibrate` (or v100lab.measure.calibration.measure_host)",
                  extra={"measured": False, "fingerprint": fp})


# ------------------------------------------------------------------------------------------------
# a sparse device file: the fields the speed model needs, inferred from the catalog
# ------------------------------------------------------------------------------------------------

#: FP16 / FP32 ALU rate of architectures without tensor cores, where the ratio is the architecture's, not the
#: SKU's: CUDA C++ Programming Guide, "Arithmetic Instructions" (results per clock per multiprocessor: 16-bit vs
#: 32-bit floating-point multiply-add). GP100 (6.0) and Tegra (5.3, 6.2) run FP16 at twice FP32; the GP10x cards
#: (6.1: P40, GTX 10x0) at 1/64.
FP16_PER_FP32_BY_CC = {"5.3": 2.0, "6.0": 2.0, "6.1": 1.0 / 64.0, "6.2": 2.0}
_SPEED_FIELDS = ("fp16_tflops", "fp32_tflops", "board_power_w", "host_link_gbs")
_UNITS = {"board_power_w": " W", "fp32_tflops": " TFLOP/s", "fp16_tflops": " TFLOP/s", "host_link_gbs": " GB/s"}


@dataclass(frozen=True)
class Assumption:
    """One field a device lacked, the value the speed model uses instead, and why.

    ``low``/``high``: the field's range among the catalog cards it was inferred from (what it could be), for
    judging how much a prediction depends on it; None for a field without a number (compute capability)."""

    field: str
    value: float | None
    basis: str
    low: float | None = None
    high: float | None = None

    @property
    def line(self) -> str:
        if self.value is None:
            return f"{self.field} not given: {self.basis}; add it from the card's spec sheet"
        return (f"{self.field} assumed {self.value:.4g}{_UNITS.get(self.field, '')} from {self.basis}; "
                "add it from the card's spec sheet")


def _cc_text(dev: Device) -> str | None:
    return str(dev.compute_capability).strip() if dev.compute_capability else None


def _reference_gpus(reference) -> list[Device]:
    """The catalog GPUs that have every field an inference reads."""
    refs = catalog().values() if reference is None else reference
    return [d for d in refs if d.kind == "gpu" and d.compute_capability and d.fp16_tflops and d.fp32_tflops
            and d.board_power_w and d.host_link_gbs]


def _class_of(cc: str | None, refs: list[Device]) -> tuple[list[Device], str]:
    """The reference cards of ``cc`` (else of its major version, else all with tensor cores), and the words
    that say which."""
    if cc is not None:
        same = [d for d in refs if _cc_text(d) == cc]
        if same:
            return same, f"compute capability {cc}"
        major = cc.split(".")[0]
        same = [d for d in refs if _cc_text(d).split(".")[0] == major]
        if same:
            return same, f"compute capability {major}.x (no catalog card of {cc})"
    tensor = [d for d in refs if _cc_text(d) not in FP16_PER_FP32_BY_CC]
    why = "compute capability not given" if cc is None else f"no catalog card of compute capability {cc}"
    return tensor or refs, f"the catalog's GPUs ({why})"


def complete_gpu(device: Device, reference=None) -> tuple[Device, tuple[Assumption, ...]]:
    """A CUDA device with the speed model's fields filled in where a device file left them out, and what was assumed.

    Compute capability picks the class: the reference cards of that capability. In it, the card nearest in
    bandwidth per TFLOP/s gives the FP16:FP32 ratio (a consumer and a workstation board of one chip differ 2x
    there; without tensor cores the architecture's ratio) and the board power per FP32 TFLOP/s; the host link
    is the class's most common. ``reference``: the cards to infer from (default: the catalog)."""
    cc = _cc_text(device)
    if device.kind != "gpu" or (cc is not None and all(getattr(device, f) for f in _SPEED_FIELDS)):
        return device, ()        # a field of 0 counts as missing, as the speed model reads it
    refs = [d for d in _reference_gpus(reference) if d.id != device.id]
    t16, t32 = device.fp16_tflops or None, device.fp32_tflops or None
    given = t16 if t16 is not None else t32
    if not refs:
        return device, ()
    group, basis = _class_of(cc, refs)
    out: list[Assumption] = []
    if cc is None:
        out.append(Assumption("compute_capability", None, "llama.cpp's kernel family is not known (predicted as "
                              "Turing or later, int8 tensor cores) and the other fields come from all catalog GPUs"))
    fills: dict[str, float] = {}
    if given is not None:
        # the class card nearest in bandwidth per given TFLOP/s: a consumer board (FP16 tensor rate halved) sits
        # far from a workstation board of the same chip there
        peak = "fp16_tflops" if t16 is not None else "fp32_tflops"
        mine = device.bandwidth_gbs / given
        near = min(group, key=lambda d: (abs(math.log(d.bandwidth_gbs / getattr(d, peak) / mine)), d.id))
        if t16 is None or t32 is None:
            fixed = FP16_PER_FP32_BY_CC.get(cc) if cc is not None else None
            if fixed is not None:
                ratio = lo = hi = fixed
                why = f"compute capability {cc} (FP16 at {fixed:.3g}x FP32, the architecture's ratio)"
            else:
                ratios = [d.fp16_tflops / d.fp32_tflops for d in group]
                ratio, lo, hi = near.fp16_tflops / near.fp32_tflops, min(ratios), max(ratios)
                why = f"{basis}: FP16:FP32 {ratio:.3g} of {near.id}, the nearest in bandwidth per TFLOP/s"
            if t32 is None:
                fills["fp32_tflops"] = t32 = round(given / ratio, 3)
                out.append(Assumption("fp32_tflops", t32, why, given / hi, given / lo))
            else:
                fills["fp16_tflops"] = t16 = round(given * ratio, 3)
                out.append(Assumption("fp16_tflops", t16, why, given * lo, given * hi))
        if not device.board_power_w:
            w_per = [d.board_power_w / d.fp32_tflops for d in group]
            near_w = near.board_power_w / near.fp32_tflops
            fills["board_power_w"] = w = float(round(t32 * near_w))
            out.append(Assumption("board_power_w", w, f"{basis}: {near_w:.3g} W per FP32 TFLOP/s of {near.id}",
                                  t32 * min(w_per), t32 * max(w_per)))
    if not device.host_link_gbs:
        links = [d.host_link_gbs for d in group]
        link = max(sorted(set(links)), key=links.count)
        fills["host_link_gbs"] = link
        out.append(Assumption("host_link_gbs", link, f"{basis}: the most common host link there",
                              min(links), max(links)))
    if fills:   # an inference from an extreme given figure stays within what a device may hold
        device = replace(device, **{k: min(v, _RANGES[k][1]) for k, v in fills.items()})
    return device, tuple(out)
