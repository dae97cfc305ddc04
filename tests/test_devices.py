"""The device catalog (data, one source per row) and the host: read from its stored profile, measured only
when asked."""

from __future__ import annotations

import csv
import io
import json
from importlib import resources

import psutil
import pytest

from v100lab.measure import calibration
from v100lab.facts import devices
from v100lab.base.errors import DeviceError

REQUIRED_IDS = ("v100-16gb", "v100-32gb", "v100-sxm2-16gb", "v100-sxm2-32gb", "p40", "p100-16gb", "t4", "a10",
                "a100-40gb", "a100-80gb", "l4", "l40s", "h100-sxm", "h100-pcie", "h200", "rtx-3090", "rtx-4090",
                "rtx-5090")


def test_catalog_has_the_issue_devices_with_sources_and_units():
    cat = devices.catalog()
    for dev_id in REQUIRED_IDS:
        assert dev_id in cat, dev_id
    for d in cat.values():
        assert d.source_url.startswith("https://"), d.id
        assert d.memory_gib > 0 and d.bandwidth_gbs > 0
        assert d.kind in devices.KINDS
        if d.kind == "gpu":
            assert d.compute_capability and d.host_link_gbs and d.runtime_overhead_mib > 0 and d.fp16_tflops
    v100 = cat["v100-16gb"]
    assert v100.capacity_bytes == 16 * 2**30
    assert v100.bandwidth_bytes_per_s == 900e9
    assert v100.compute_capability == "7.0"
    # ids are unique and lower-case (the file is the one source of truth)
    assert all(k == k.lower() for k in cat)


def test_apple_rows_match_the_published_table():
    """Every Apple catalog row is backed by the llama-bench table shipped in v100lab/data, and back."""
    apple = [d for d in devices.catalog().values() if d.kind == "apple"]
    text = resources.files("v100lab").joinpath("data", "apple_silicon_llama7b.csv").read_text()
    rows = list(csv.DictReader(io.StringIO("".join(line + "\n" for line in text.splitlines()
                                                   if not line.startswith("#")))))
    pairs = {(r["chip"], float(r["bandwidth_gbs"])) for r in rows}
    assert len(pairs) >= 10
    for chip, bw in pairs:
        match = [d for d in apple if d.bandwidth_gbs == bw and d.name.startswith(f"Apple {chip} ")]
        assert match, f"no catalog row for {chip} at {bw} GB/s"
    for d in apple:   # and no Apple row the table does not back
        assert any(d.name.startswith(f"Apple {chip} ") and d.bandwidth_gbs == bw for chip, bw in pairs), d.id


def test_unknown_id_names_it_and_the_known_ones():
    with pytest.raises(DeviceError) as exc:
        devices.get_device("v100-17gb")
    msg = str(exc.value)
    assert "v100-17gb" in msg and "v100-16gb" in msg and "host" in msg
    assert "\n" not in msg


def test_device_files_yaml_and_json(tmp_path):
    y = tmp_path / "mycard.yaml"
    y.write_text("name: My card\nkind: gpu\nmemory_gib: 12\nbandwidth_gbs: 360\nruntime_overhead_mib: 300\n"
                 "compute_capability: 8.6\nsource_url: https://example.org/card\n")
    d = devices.get_device(str(y))
    assert d.id == "mycard" and d.memory_gib == 12 and d.compute_capability == "8.6"
    assert d.overhead_bytes == 300 * 2**20
    j = tmp_path / "card.json"
    j.write_text(json.dumps({"devices": [{"id": "x", "name": "X", "kind": "apple", "memory_gib": 8,
                                          "bandwidth_gbs": 100}]}))
    assert devices.get_device(j).kind == "apple"


@pytest.mark.parametrize("text, words", [
    ("name: A\nkind: gpu\nmemory_gib: 12\n", ["bandwidth_gbs"]),                                # missing field
    ("name: A\nkind: gpu\nmemory_gib: 12\nbandwidth_gbs: 1\nvram: 3\n", ["unknown", "vram"]),  # unknown key
    ("name: A\nkind: tpu\nmemory_gib: 12\nbandwidth_gbs: 1\n", ["kind", "tpu"]),
    ("name: A\nkind: gpu\nmemory_gib: -1\nbandwidth_gbs: 1\n", ["memory_gib"]),
    ("name: [unclosed\n", ["YAML"]),
])
def test_bad_device_files_are_one_line_errors(tmp_path, text, words):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(DeviceError) as exc:
        devices.get_device(p)
    for w in words:
        assert w in str(exc.value)


def test_missing_device_file(tmp_path):
    with pytest.raises(DeviceError):
        devices.get_device(tmp_path / "nope.yaml")


def test_host_is_measured_cached_and_keeps_other_fields(fresh_cache):
    profile = calibration.measure_host()
    h = devices.get_device("host")
    assert h.kind == "cpu" and h.id == "host" and h.bandwidth_gbs == profile["bandwidth_gbs"]
    assert abs(h.capacity_bytes - psutil.virtual_memory().total) < 2**20 * 2
    assert h.bandwidth_gbs > 0.5        # measured, whatever the machine
    bw = h.extra["bandwidth_measurement"]
    assert bw["threads"] >= 1 and len(bw["samples_gbs"]) >= 3 and bw["cv"] >= 0
    path = devices.host_profile_path()
    assert path.parent == fresh_cache and path.exists()
    # another tool (v100lab calibrate) adds its own fields; reading keeps them, and no re-measurement happens
    devices.write_host_profile({"calibration": {"tg_efficiency": 0.7}})
    again = devices.get_device("host")
    assert again.extra["calibration"] == {"tg_efficiency": 0.7}
    assert again.bandwidth_gbs == h.bandwidth_gbs
    assert json.loads(path.read_text())["measured_at"] == h.extra["measured_at"]


def test_reading_an_unmeasured_host_measures_nothing(fresh_cache):
    """get_device("host") is a getter: without a stored profile it states the assumed bandwidth and writes
    nothing; measuring is the explicit calibration.measured_host() / measure_host()."""
    h = devices.get_device("host")
    assert h.extra["measured"] is False and h.bandwidth_gbs == devices.UNMEASURED_HOST_BANDWIDTH_GBS
    assert "not measured" in h.name and "calibrate" in h.source_url
    assert abs(h.capacity_bytes - psutil.virtual_memory().total) < 2**20 * 2
    assert not devices.host_profile_path().exists() and not devices.host_measured()
    m = calibration.measured_host()
    assert "measured" not in m.extra and devices.host_measured()
    assert devices.get_device("host").bandwidth_gbs == m.bandwidth_gbs


def test_host_profile_from_another_machine_is_ignored(fresh_cache):
    devices.write_host_profile({"id": "host", "name": "other", "kind": "cpu", "memory_gib": 1, "bandwidth_gbs": 1,
                                "fingerprint": {"hostname": "elsewhere", "cpu_count": 999, "ram_bytes": 1}})
    h = devices.get_device("host")
    assert h.extra["fingerprint"]["hostname"] != "elsewhere" and h.extra["measured"] is False
    assert not devices.host_measured()
    assert calibration.measured_host().extra["fingerprint"]["hostname"] != "elsewhere"


# ---- a sparse device file: the speed fields it lacks inferred from the catalog, and named ----------------

def _sparse(tmp_path, text):
    path = tmp_path / "mine.yaml"
    path.write_text("name: My card\nkind: gpu\nmemory_gib: 24\n" + text)
    return devices.get_device(path)


def test_a_headline_device_file_is_completed_from_its_class_and_says_so(tmp_path):
    dev = _sparse(tmp_path, "bandwidth_gbs: 936\nfp16_tflops: 71\ncompute_capability: \"8.6\"\n")
    full, assumed = devices.complete_gpu(dev)
    assert {a.field for a in assumed} == {"fp32_tflops", "board_power_w", "host_link_gbs"}
    # a GeForce board's FP16 tensor rate is half a workstation board's: the ratio comes from its own kind
    assert full.fp32_tflops == pytest.approx(devices.get_device("rtx-3090").fp32_tflops, rel=0.05)
    assert full.board_power_w and full.host_link_gbs and full.fp16_tflops == 71
    for a in assumed:
        assert "compute capability 8.6" in a.line and a.line.startswith(f"{a.field} assumed ")
        assert a.low <= a.value <= a.high
    assert dev.fp32_tflops is None          # the device itself is not changed


def test_catalog_devices_and_complete_files_assume_nothing(tmp_path):
    for d in devices.catalog().values():
        full, assumed = devices.complete_gpu(d)
        assert full is d and assumed == ()
    dev = _sparse(tmp_path, "bandwidth_gbs: 936\nfp16_tflops: 71\nfp32_tflops: 35.6\nboard_power_w: 350\n"
                            "host_link_gbs: 31.5\ncompute_capability: \"8.6\"\n")
    assert devices.complete_gpu(dev) == (dev, ())


def test_inference_uses_only_the_reference_it_is_given(tmp_path):
    dev = _sparse(tmp_path, "bandwidth_gbs: 936\nfp16_tflops: 71\ncompute_capability: \"8.6\"\n")
    others = [d for d in devices.catalog().values() if d.id not in ("rtx-3090", "rtx-3090-ti")]
    _, assumed = devices.complete_gpu(dev, others)
    assert not any("rtx-3090" in a.line for a in assumed)
    _, with_all = devices.complete_gpu(dev)
    assert any("rtx-3090" in a.line for a in with_all)


def test_pascal_fp32_comes_from_the_architecture_and_no_capability_is_named(tmp_path):
    p40 = devices.get_device("p40")
    dev = _sparse(tmp_path, f"bandwidth_gbs: 346\nfp16_tflops: {p40.fp16_tflops}\ncompute_capability: \"6.1\"\n")
    others = [d for d in devices.catalog().values() if d.id != "p40"]
    full, assumed = devices.complete_gpu(dev, others)
    assert full.fp32_tflops == pytest.approx(p40.fp32_tflops, rel=0.05)
    assert "architecture" in next(a.line for a in assumed if a.field == "fp32_tflops")
    nocc = _sparse(tmp_path, "bandwidth_gbs: 936\nfp16_tflops: 71\n")
    _, assumed = devices.complete_gpu(nocc)
    cc = next(a for a in assumed if a.field == "compute_capability")
    assert cc.value is None and "not given" in cc.line and "kernel family" in cc.line
