/* A stand-in libnvidia-ml for tests: one H200-like GPU (143771 MiB, driver 580.159.04, CUDA 13.0)
   whose used memory and compute processes come from the environment, so the ctypes code in
   host/probe_child.py (struct layouts, the two-call process listing) runs for real without a GPU.
     FAKE_NVML_PROCS="pid:mib,pid:mib"   compute processes (their memory counts as used)
     FAKE_NVML_UTIL=percent              GPU utilization
   Build: cc -shared -fPIC -o libnvidia-ml.so.1 fake_nvml.c */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;

#define MIB (1024ULL * 1024ULL)
#define TOTAL_MIB 143771ULL
#define DRIVER_MIB 553ULL /* what an idle H200 shows as used */
static int handle_token = 0;

const char *nvmlErrorString(int rc) { return rc == 7 ? "Insufficient Size" : "Unknown Error"; }
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlSystemGetDriverVersion(char *buf, unsigned int n) { snprintf(buf, n, "580.159.04"); return 0; }
int nvmlSystemGetCudaDriverVersion_v2(int *v) { *v = 13000; return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) { if (i) return 2; *h = &handle_token; return 0; }
int nvmlDeviceGetName(void *h, char *buf, unsigned int n) { snprintf(buf, n, "NVIDIA H200"); return 0; }
int nvmlDeviceGetUUID(void *h, char *buf, unsigned int n) { snprintf(buf, n, "GPU-fa4e0000-0000-0000-0000-000000000000"); return 0; }
int nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) { *major = 9; *minor = 0; return 0; }
int nvmlSystemGetProcessName(unsigned int pid, char *buf, unsigned int n) { return 999; /* as in a PID namespace */ }

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
    nvmlProcessInfo_t p[64];
    int n = parse(p, 64);
    unsigned long long used = DRIVER_MIB * MIB;
    for (int i = 0; i < n && i < 64; i++) used += p[i].usedGpuMemory;
    m->total = TOTAL_MIB * MIB; m->used = used; m->free = m->total - used;
    return 0;
}

int nvmlDeviceGetUtilizationRates(void *h, nvmlUtilization_t *u) {
    const char *env = getenv("FAKE_NVML_UTIL");
    u->gpu = env ? (unsigned int)atoi(env) : 0; u->memory = u->gpu / 2;
    return 0;
}

int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned int *count, nvmlProcessInfo_t *infos) {
    unsigned int n = (unsigned int)parse(NULL, 0);
    if (*count < n || (!infos && n)) { *count = n; return 7; }
    *count = (unsigned int)parse(infos, *count);
    return 0;
}
