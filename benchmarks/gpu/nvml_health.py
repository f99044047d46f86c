"""Record every NVML figure a GPU health check reads, with each call's return code, on a real GPU.

    python3 benchmarks/gpu/nvml_health.py > nvml-health.json

Standard library only (ctypes over libnvidia-ml.so.1, as host/gpus.py reads it), no root. Per GPU:
identity (index, UUID, PCI bus id, name), ECC mode and counts (corrected / uncorrected, volatile /
aggregate), row remapping (Ampere and later), retired pages (older boards), clock event reasons
(current and supported), the PCIe link (current and maximum generation and width), temperature,
power, the event types the driver can report (nvmlDeviceGetSupportedEventTypes) and whether a
critical-XID event set can be registered and waited on. Each value is recorded with NVML's return
code (0 success, 3 not supported, ...), so a stand-in can answer exactly as this GPU did. It also
times one full health read and one 100 ms event wait: what a watcher in `dflashctl serve` would cost.
"""

import ctypes
import json
import socket
import time

NVML_SUCCESS = 0
ERRORS = {0: "SUCCESS", 1: "UNINITIALIZED", 2: "INVALID_ARGUMENT", 3: "NOT_SUPPORTED", 4: "NO_PERMISSION",
          7: "INSUFFICIENT_SIZE", 10: "TIMEOUT", 12: "FUNCTION_NOT_FOUND", 15: "GPU_IS_LOST", 999: "UNKNOWN"}
XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError


class PciInfo(ctypes.Structure):  # nvmlPciInfo_t (v3)
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


class EventData(ctypes.Structure):  # nvmlEventData_t
    _fields_ = [("device", ctypes.c_void_p), ("eventType", ctypes.c_ulonglong), ("eventData", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


def main() -> None:
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    out: dict = {"format": "dflashctl-nvml-health-recording", "hostname": socket.gethostname(),
                 "recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z")}

    def call(fn_name: str, *args) -> int:
        fn = getattr(nvml, fn_name, None)
        if fn is None:
            return 12
        return fn(*args)

    def rec(where: dict, key: str, rc: int, value=None) -> None:
        where[key] = {"rc": rc, "error": ERRORS.get(rc, str(rc))} if rc else {"rc": 0, "value": value}

    assert call("nvmlInit_v2") == 0
    buf = ctypes.create_string_buffer(96)
    call("nvmlSystemGetDriverVersion", buf, 96)
    out["driver"] = buf.value.decode()
    count = ctypes.c_uint()
    call("nvmlDeviceGetCount_v2", ctypes.byref(count))
    out["gpus"] = []
    for i in range(count.value):
        g: dict = {"index": i}
        h = ctypes.c_void_p()
        rec(g, "handle", call("nvmlDeviceGetHandleByIndex_v2", i, ctypes.byref(h)))
        for key, fn in (("name", "nvmlDeviceGetName"), ("uuid", "nvmlDeviceGetUUID"), ("serial", "nvmlDeviceGetSerial")):
            b = ctypes.create_string_buffer(96)
            rc = call(fn, h, b, 96)
            rec(g, key, rc, b.value.decode() if rc == 0 else None)
        pci = PciInfo()
        rc = call("nvmlDeviceGetPciInfo_v3", h, ctypes.byref(pci))
        rec(g, "pci", rc, {"busId": pci.busId.decode(), "domain": pci.domain, "bus": pci.bus, "device": pci.device,
                           "pciDeviceId": hex(pci.pciDeviceId)} if rc == 0 else None)
        cur, pend = ctypes.c_uint(), ctypes.c_uint()
        rc = call("nvmlDeviceGetEccMode", h, ctypes.byref(cur), ctypes.byref(pend))
        rec(g, "ecc_mode", rc, {"current": cur.value, "pending": pend.value})
        ecc = {}
        for etype, ename in ((0, "corrected"), (1, "uncorrected")):
            for ctype, cname in ((0, "volatile"), (1, "aggregate")):
                v = ctypes.c_ulonglong()
                rc = call("nvmlDeviceGetTotalEccErrors", h, etype, ctype, ctypes.byref(v))
                rec(ecc, f"{ename}_{cname}", rc, v.value)
        g["ecc_errors"] = ecc
        corr, unc, pending, failed = (ctypes.c_uint() for _ in range(4))
        rc = call("nvmlDeviceGetRemappedRows", h, ctypes.byref(corr), ctypes.byref(unc), ctypes.byref(pending),
                  ctypes.byref(failed))
        rec(g, "remapped_rows", rc, {"correctable": corr.value, "uncorrectable": unc.value,
                                     "pending": pending.value, "failure": failed.value})
        retired = {}
        for cause, cname in ((0, "multiple_single_bit"), (1, "double_bit")):
            n = ctypes.c_uint(0)
            rc = call("nvmlDeviceGetRetiredPages", h, cause, ctypes.byref(n), None)
            rec(retired, cname, rc, n.value)
        g["retired_pages"] = retired
        rp = ctypes.c_uint()
        rec(g, "retired_pages_pending", call("nvmlDeviceGetRetiredPagesPendingStatus", h, ctypes.byref(rp)), rp.value)
        for key, fn in (("clock_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons"),
                        ("clock_event_reasons_supported", "nvmlDeviceGetSupportedClocksEventReasons"),
                        ("clock_throttle_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons")):
            v = ctypes.c_ulonglong()
            rc = call(fn, h, ctypes.byref(v))
            rec(g, key, rc, hex(v.value))
        link = {}
        for key, fn in (("gen_current", "nvmlDeviceGetCurrPcieLinkGeneration"),
                        ("gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
                        ("gen_gpu_max", "nvmlDeviceGetGpuMaxPcieLinkGeneration"),
                        ("width_current", "nvmlDeviceGetCurrPcieLinkWidth"),
                        ("width_max", "nvmlDeviceGetMaxPcieLinkWidth")):
            v = ctypes.c_uint()
            rec(link, key, call(fn, h, ctypes.byref(v)), v.value)
        g["pcie"] = link
        t = ctypes.c_uint()
        rec(g, "temperature_c", call("nvmlDeviceGetTemperature", h, 0, ctypes.byref(t)), t.value)
        p = ctypes.c_uint()
        rec(g, "power_mw", call("nvmlDeviceGetPowerUsage", h, ctypes.byref(p)), p.value)
        pm = ctypes.c_uint()
        rec(g, "persistence_mode", call("nvmlDeviceGetPersistenceMode", h, ctypes.byref(pm)), pm.value)
        ev = ctypes.c_ulonglong()
        rc = call("nvmlDeviceGetSupportedEventTypes", h, ctypes.byref(ev))
        rec(g, "supported_event_types", rc, hex(ev.value))
        # Timings: one full health read, and a critical-XID event set waited on for 100 ms.
        t0 = time.perf_counter()
        for _ in range(20):
            v = ctypes.c_ulonglong()
            call("nvmlDeviceGetTotalEccErrors", h, 1, 0, ctypes.byref(v))
            call("nvmlDeviceGetRemappedRows", h, ctypes.byref(corr), ctypes.byref(unc), ctypes.byref(pending),
                 ctypes.byref(failed))
            call("nvmlDeviceGetCurrentClocksEventReasons", h, ctypes.byref(v))
            call("nvmlDeviceGetCurrPcieLinkGeneration", h, ctypes.byref(t))
            call("nvmlDeviceGetCurrPcieLinkWidth", h, ctypes.byref(t))
        g["health_read_ms"] = round((time.perf_counter() - t0) / 20 * 1000, 3)
        es = ctypes.c_void_p()
        rec(g, "event_set_create", call("nvmlEventSetCreate", ctypes.byref(es)))
        rec(g, "register_xid_critical", call("nvmlDeviceRegisterEvents", h, ctypes.c_ulonglong(XID_CRITICAL), es))
        data = EventData()
        t0 = time.perf_counter()
        rc = call("nvmlEventSetWait_v2", es, ctypes.byref(data), 100)
        g["event_wait_100ms"] = {"rc": rc, "error": ERRORS.get(rc, str(rc)),
                                 "took_ms": round((time.perf_counter() - t0) * 1000, 1)}
        call("nvmlEventSetFree", es)
        out["gpus"].append(g)
    call("nvmlShutdown")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
