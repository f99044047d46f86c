/* A stand-in libnvidia-ml for tests, so the ctypes code in host/probe_child.py (struct layouts, the
   two-call process listing, the health figures, the critical-XID event set) runs for real without a
   GPU. Without a scenario: one H200-like GPU (143771 MiB, driver 580.159.04, CUDA 13.0) that answers
   NOT_SUPPORTED to every health call. Its used memory and compute processes come from the environment:
     FAKE_NVML_PROCS="pid:mib,pid:mib"   compute processes on GPU 0 (their memory counts as used)
     FAKE_NVML_UTIL=percent              GPU utilization
     FAKE_NVML_SCENARIO=FILE             the GPUs' answers, one per line: KEY RC [VALUE]
   A scenario's keys (tests/nvml_scenario.py writes them from tests/data/gpus/h200-health.json):
     driver, cuda, count, event_set_create           the system
     N.handle N.name N.uuid N.pci.busId ...          GPU N's figures, named as in the recording
     N.lost 0 1                                      every call on GPU N returns GPU_IS_LOST (15)
     N.xid 0 79, N.xid_file 0 PATH                   the event set delivers XID 79 once PATH exists
     N.xid_delay_ms 0 MS                             ... and the waiting process creates PATH MS after
                                                     it registered for the event
     after.N.KEY RC VALUE                            GPU N's answer once PATH exists (any process)
   A key the scenario lacks is NOT_SUPPORTED (3), like a figure a board does not have.
   Build: cc -shared -fPIC -o libnvidia-ml.so.1 fake_nvml.c */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } nvmlPciInfo_t;
typedef struct { void *device; unsigned long long eventType, eventData; unsigned int gpuInstanceId, computeInstanceId; } nvmlEventData_t;
typedef struct { unsigned int fieldId, scopeId; long long timestamp, latencyUsec; int valueType, nvmlReturn; unsigned long long value; } nvmlFieldValue_t;

#define MIB (1024ULL * 1024ULL)
#define TOTAL_MIB 143771ULL
#define DRIVER_MIB 553ULL /* what an idle H200 shows as used */
#define MAX_GPUS 8
#define NOT_SUPPORTED 3
#define INSUFFICIENT_SIZE 7
#define TIMEOUT 10
#define GPU_IS_LOST 15
#define XID_CRITICAL 0x8ULL

/* ---------------------------------------------------------------------------------- the scenario */
typedef struct { char key[96]; int rc; char value[160]; } entry_t;
static entry_t entries[1024];
static int n_entries = -1;
static int handles[MAX_GPUS] = {0, 1, 2, 3, 4, 5, 6, 7};

static void load(void) {
    if (n_entries >= 0) return;
    n_entries = 0;
    const char *path = getenv("FAKE_NVML_SCENARIO");
    FILE *f = path && *path ? fopen(path, "r") : NULL;
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f) && n_entries < 1024) {
        entry_t *e = &entries[n_entries];
        int used = 0;
        line[strcspn(line, "\n")] = 0;
        if (!line[0] || line[0] == '#') continue;
        if (sscanf(line, "%95s %d %n", e->key, &e->rc, &used) < 2) continue;
        snprintf(e->value, sizeof e->value, "%s", line + used);
        n_entries++;
    }
    fclose(f);
}

static const entry_t *find(const char *key) {
    load();
    for (int i = 0; i < n_entries; i++)
        if (!strcmp(entries[i].key, key)) return &entries[i];
    return NULL;
}

static int have_scenario(void) { load(); return n_entries > 0; }

static int fired(int gpu) { /* the XID of GPU `gpu` has happened (its file exists) */
    char key[32];
    snprintf(key, sizeof key, "%d.xid_file", gpu);
    const entry_t *e = find(key);
    return e && access(e->value, F_OK) == 0;
}

/* GPU `gpu`'s answer for `name`: the after-state once its XID has fired, else the scenario's. */
static const entry_t *gpu_entry(int gpu, const char *name) {
    char key[128];
    if (fired(gpu)) {
        snprintf(key, sizeof key, "after.%d.%s", gpu, name);
        const entry_t *e = find(key);
        if (e) return e;
    }
    snprintf(key, sizeof key, "%d.%s", gpu, name);
    return find(key);
}

static int lost(int gpu) {
    const entry_t *e = gpu_entry(gpu, "lost");
    return e && atoi(e->value);
}

static int index_of(void *h) { return h ? *(int *)h : 0; }

/* rc and integer value of a figure; NOT_SUPPORTED when the scenario lacks it, GPU_IS_LOST when lost. */
static int number(void *h, const char *name, unsigned long long *out) {
    int gpu = index_of(h);
    if (lost(gpu)) return GPU_IS_LOST;
    const entry_t *e = gpu_entry(gpu, name);
    if (!e) return NOT_SUPPORTED;
    if (e->rc == 0 && out) *out = strtoull(e->value, NULL, 0);
    return e->rc;
}

static int text(void *h, const char *name, char *buf, unsigned int n, const char *fallback) {
    int gpu = index_of(h);
    if (lost(gpu)) return GPU_IS_LOST;
    const entry_t *e = gpu_entry(gpu, name);
    if (!e) { if (!fallback) return NOT_SUPPORTED; snprintf(buf, n, "%s", fallback); return 0; }
    if (e->rc == 0) snprintf(buf, n, "%s", e->value);
    return e->rc;
}

/* ------------------------------------------------------------------------------------ the system */
const char *nvmlErrorString(int rc) {
    switch (rc) {
    case 0: return "Success";
    case NOT_SUPPORTED: return "Not Supported";
    case INSUFFICIENT_SIZE: return "Insufficient Size";
    case TIMEOUT: return "Timeout";
    case GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlSystemGetDriverVersion(char *buf, unsigned int n) {
    const entry_t *e = find("driver");
    snprintf(buf, n, "%s", e ? e->value : "580.159.04");
    return 0;
}
int nvmlSystemGetCudaDriverVersion_v2(int *v) { const entry_t *e = find("cuda"); *v = e ? atoi(e->value) : 13000; return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { const entry_t *e = find("count"); *n = e ? (unsigned)atoi(e->value) : 1; return 0; }
int nvmlSystemGetProcessName(unsigned int pid, char *buf, unsigned int n) { return 999; /* as in a PID namespace */ }

int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) {
    unsigned int count;
    nvmlDeviceGetCount_v2(&count);
    if (i >= count || i >= MAX_GPUS) return 2;
    if (lost((int)i)) return GPU_IS_LOST;
    const entry_t *e = gpu_entry((int)i, "handle");
    if (e && e->rc) return e->rc;
    *h = &handles[i];
    return 0;
}

/* ------------------------------------------------------------------------------ identity, memory */
int nvmlDeviceGetName(void *h, char *buf, unsigned int n) { return text(h, "name", buf, n, "NVIDIA H200"); }
int nvmlDeviceGetUUID(void *h, char *buf, unsigned int n) {
    return text(h, "uuid", buf, n, "GPU-fa4e0000-0000-0000-0000-000000000000");
}
int nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) {
    if (lost(index_of(h))) return GPU_IS_LOST;
    *major = 9; *minor = 0;
    return 0;
}

static int parse(nvmlProcessInfo_t *out, unsigned int cap) {
    const char *env = getenv("FAKE_NVML_PROCS");
    int count = 0;
    if (!env || !*env) return 0;
    char *copy = strdup(env), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save), count++) {
        if (out && (unsigned int)count < cap) {
            unsigned int pid = 0; unsigned long long mib = 0;
            sscanf(tok, "%u:%llu", &pid, &mib);
            out[count].pid = pid; out[count].usedGpuMemory = mib * MIB;
            out[count].gpuInstanceId = out[count].computeInstanceId = 0xFFFFFFFF;
        }
    }
    free(copy);
    return count;
}

int nvmlDeviceGetMemoryInfo(void *h, nvmlMemory_t *m) {
    if (lost(index_of(h))) return GPU_IS_LOST;
    nvmlProcessInfo_t p[64];
    int n = index_of(h) == 0 ? parse(p, 64) : 0;
    unsigned long long used = DRIVER_MIB * MIB;
    for (int i = 0; i < n && i < 64; i++) used += p[i].usedGpuMemory;
    m->total = TOTAL_MIB * MIB; m->used = used; m->free = m->total - used;
    return 0;
}

int nvmlDeviceGetUtilizationRates(void *h, nvmlUtilization_t *u) {
    if (lost(index_of(h))) return GPU_IS_LOST;
    const char *env = getenv("FAKE_NVML_UTIL");
    u->gpu = env ? (unsigned int)atoi(env) : 0; u->memory = u->gpu / 2;
    return 0;
}

int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned int *count, nvmlProcessInfo_t *infos) {
    if (lost(index_of(h))) return GPU_IS_LOST;
    unsigned int n = index_of(h) == 0 ? (unsigned int)parse(NULL, 0) : 0;
    if (*count < n || (!infos && n)) { *count = n; return INSUFFICIENT_SIZE; }
    *count = index_of(h) == 0 ? (unsigned int)parse(infos, *count) : 0;
    return 0;
}

/* -------------------------------------------------------------------------------- health figures */
int nvmlDeviceGetPciInfo_v3(void *h, nvmlPciInfo_t *pci) {
    unsigned long long id = 0;
    memset(pci, 0, sizeof *pci);
    int rc = text(h, "pci.busId", pci->busId, sizeof pci->busId, NULL);
    if (rc) return rc;
    number(h, "pci.pciDeviceId", &id);
    pci->pciDeviceId = (unsigned int)id;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", pci->busId + (strlen(pci->busId) > 12 ? 4 : 0));
    return 0;
}

int nvmlDeviceGetEccMode(void *h, unsigned int *current, unsigned int *pending) {
    unsigned long long c = 0, p = 0;
    int rc = number(h, "ecc_mode.current", &c);
    if (rc) return rc;
    number(h, "ecc_mode.pending", &p);
    *current = (unsigned int)c; *pending = (unsigned int)p;
    return 0;
}

int nvmlDeviceGetTotalEccErrors(void *h, int errorType, int counterType, unsigned long long *count) {
    char name[64];
    snprintf(name, sizeof name, "ecc_errors.%s_%s", errorType ? "uncorrected" : "corrected",
             counterType ? "aggregate" : "volatile");
    return number(h, name, count);
}

int nvmlDeviceGetRemappedRows(void *h, unsigned int *corr, unsigned int *unc, unsigned int *pending, unsigned int *failure) {
    const char *names[4] = {"remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending",
                            "remapped_rows.failure"};
    unsigned int *out[4] = {corr, unc, pending, failure};
    for (int i = 0; i < 4; i++) {
        unsigned long long v = 0;
        int rc = number(h, names[i], &v);
        if (rc) return rc;
        *out[i] = (unsigned int)v;
    }
    return 0;
}

int nvmlDeviceGetRetiredPages(void *h, int cause, unsigned int *count, unsigned long long *addresses) {
    unsigned long long n = 0;
    int rc = number(h, cause ? "retired_pages.double_bit" : "retired_pages.multiple_single_bit", &n);
    if (rc) return rc;
    if (*count < n) { *count = (unsigned int)n; return INSUFFICIENT_SIZE; }
    *count = (unsigned int)n;
    for (unsigned int i = 0; addresses && i < n; i++) addresses[i] = 0x1000ULL * (i + 1);
    return 0;
}

static int uint_figure(void *h, const char *name, unsigned int *out) {
    unsigned long long v = 0;
    int rc = number(h, name, &v);
    if (!rc) *out = (unsigned int)v;
    return rc;
}

int nvmlDeviceGetRetiredPagesPendingStatus(void *h, unsigned int *pending) { return uint_figure(h, "retired_pages_pending", pending); }
int nvmlDeviceGetCurrentClocksEventReasons(void *h, unsigned long long *r) { return number(h, "clock_event_reasons", r); }
int nvmlDeviceGetSupportedClocksEventReasons(void *h, unsigned long long *r) { return number(h, "clock_event_reasons_supported", r); }
int nvmlDeviceGetCurrPcieLinkGeneration(void *h, unsigned int *v) { return uint_figure(h, "pcie.gen_current", v); }
int nvmlDeviceGetMaxPcieLinkGeneration(void *h, unsigned int *v) { return uint_figure(h, "pcie.gen_max", v); }
int nvmlDeviceGetGpuMaxPcieLinkGeneration(void *h, unsigned int *v) { return uint_figure(h, "pcie.gen_gpu_max", v); }
int nvmlDeviceGetCurrPcieLinkWidth(void *h, unsigned int *v) { return uint_figure(h, "pcie.width_current", v); }
int nvmlDeviceGetMaxPcieLinkWidth(void *h, unsigned int *v) { return uint_figure(h, "pcie.width_max", v); }
int nvmlDeviceGetTemperature(void *h, int sensor, unsigned int *v) { return uint_figure(h, "temperature_c", v); }
int nvmlDeviceGetPowerUsage(void *h, unsigned int *v) { return uint_figure(h, "power_mw", v); }
int nvmlDeviceGetSupportedEventTypes(void *h, unsigned long long *v) { return number(h, "supported_event_types", v); }

int nvmlDeviceGetFieldValues(void *h, int n, nvmlFieldValue_t *values) {
    if (lost(index_of(h))) return GPU_IS_LOST;
    for (int i = 0; i < n; i++) {
        unsigned long long v = 0;
        values[i].nvmlReturn = values[i].fieldId == 230 ? number(h, "recovery_action", &v) : NOT_SUPPORTED;
        values[i].valueType = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
        values[i].value = v;
    }
    return 0;
}

/* ------------------------------------------------------------------------------ critical XID events */
typedef struct { unsigned long long mask[MAX_GPUS]; double registered_at[MAX_GPUS]; int delivered[MAX_GPUS]; } event_set_t;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int nvmlEventSetCreate(void **set) {
    const entry_t *e = find("event_set_create");
    if (have_scenario() && (!e || e->rc)) return e ? e->rc : NOT_SUPPORTED;
    if (!have_scenario()) return NOT_SUPPORTED;
    *set = calloc(1, sizeof(event_set_t));
    return 0;
}

int nvmlEventSetFree(void *set) { free(set); return 0; }

int nvmlDeviceRegisterEvents(void *h, unsigned long long types, void *set) {
    int gpu = index_of(h);
    if (lost(gpu)) return GPU_IS_LOST;
    const entry_t *e = gpu_entry(gpu, "register_xid_critical");
    if (!e) return NOT_SUPPORTED;
    if (e->rc) return e->rc;
    event_set_t *s = set;
    s->mask[gpu] |= types;
    s->registered_at[gpu] = now_s();
    return 0;
}

static int due(event_set_t *s, int gpu) { /* this GPU's XID is there to deliver */
    char key[32];
    unsigned long long delay = 0;
    if (!(s->mask[gpu] & XID_CRITICAL) || s->delivered[gpu] || !gpu_entry(gpu, "xid")) return 0;
    if (fired(gpu)) return 1;
    snprintf(key, sizeof key, "%d.xid_delay_ms", gpu);
    const entry_t *d = find(key);
    snprintf(key, sizeof key, "%d.xid_file", gpu);
    const entry_t *f = find(key);
    if (!d || !f) return 0;
    delay = strtoull(d->value, NULL, 0);
    if ((now_s() - s->registered_at[gpu]) * 1000 < delay) return 0;
    FILE *mark = fopen(f->value, "w"); /* every process now sees the after-state */
    if (mark) fclose(mark);
    return 1;
}

int nvmlEventSetWait_v2(void *set, nvmlEventData_t *data, unsigned int timeout_ms) {
    event_set_t *s = set;
    double end = now_s() + timeout_ms / 1000.0;
    for (;;) {
        for (int gpu = 0; gpu < MAX_GPUS; gpu++) {
            if (s->mask[gpu] && s->delivered[gpu] && lost(gpu)) return GPU_IS_LOST; /* as NVML: a GPU fell off */
            if (due(s, gpu)) {
                s->delivered[gpu] = 1;
                memset(data, 0, sizeof *data);
                data->device = &handles[gpu];
                data->eventType = XID_CRITICAL;
                data->eventData = strtoull(gpu_entry(gpu, "xid")->value, NULL, 0);
                data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFF;
                return 0;
            }
        }
        if (now_s() >= end) return TIMEOUT;
        usleep(5000);
    }
}
