"""Free-memory reports (daemon_image/weightcache/gpu/device_memory.py) from the real /proc/meminfo
and, on this GPU-less machine, from an NVML that is not there; tests/gpu checks NVML's numbers
against the CUDA runtime's."""

from __future__ import annotations

from pathlib import Path

from weightcache.gpu.device_memory import gpu_memory, host_memory, memory_report
from weightcache_contract.daemon_report import DaemonReport, RankReport, report_metrics


def test_host_memory_is_what_the_kernel_says_is_available() -> None:
    report = host_memory()
    fields = {
        line.split(":")[0]: int(line.split()[1]) * 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith(("MemTotal:", "MemAvailable:"))
    }
    assert report.device == "host" and report.error is None
    assert report.total_bytes == fields["MemTotal"]
    assert report.free_bytes is not None and 0 < report.free_bytes <= report.total_bytes
    # Read a moment apart: equal within what a busy machine allocates meanwhile (256 MiB).
    assert abs(report.free_bytes - fields["MemAvailable"]) < 256 << 20


def test_unreadable_meminfo_is_an_error_not_a_number(tmp_path: Path) -> None:
    old_kernel = tmp_path / "meminfo"
    old_kernel.write_text("MemTotal:       16384 kB\nMemFree:         1024 kB\n")  # no MemAvailable (before 3.14)
    report = host_memory(old_kernel)
    assert (report.free_bytes, report.total_bytes) == (None, None)
    assert report.error is not None and str(old_kernel) in report.error and "MemAvailable" in report.error
    missing = host_memory(tmp_path / "absent")
    assert missing.error is not None and "absent" in missing.error


def test_gpu_without_nvml_reports_why() -> None:
    report = gpu_memory("GPU-00000000-0000-0000-0000-000000000000")
    assert report.free_bytes is None and report.error is not None and report.error.startswith("NVML: ")


def test_memory_report_lists_host_then_each_gpu_once_and_reaches_the_metrics() -> None:
    memory = memory_report(["GPU-a", "GPU-b", "GPU-a"])
    assert [m.device for m in memory] == ["host", "GPU-a", "GPU-b"]
    report = DaemonReport(cache="tiny", ready=True, ranks=[RankReport(rank=0, ready=True)], memory=memory)
    text = report_metrics(report).render()
    assert f'weightcache_daemon_device_free_bytes{{cache="tiny",device="host"}} {memory[0].free_bytes}\n' in text, text
    assert f'weightcache_daemon_device_total_bytes{{cache="tiny",device="host"}} {memory[0].total_bytes}\n' in text
    assert 'device="GPU-a"' not in text, "a device that could not be read has no series, not a zero"
    assert DaemonReport.model_validate_json(report.model_dump_json()) == report
