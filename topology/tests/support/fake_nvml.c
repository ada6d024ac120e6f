/* A stand-in for libnvidia-ml.so.1: two H100s, the first with 18 active NVLinks, the
 * second without NVLink support. Built by the NVML reader's tests; -DINIT_FAILS makes
 * nvmlInit_v2 fail like a driver/library version mismatch. Declarations follow nvml.h. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

#define OK 0
#define NOT_INITIALIZED 1
#define INVALID_ARGUMENT 2
#define NOT_SUPPORTED 3
#define INSUFFICIENT_SIZE 7
#define DRIVER_MISMATCH 18

static int initialized;

static int index_of(nvmlDevice_t d)
{
    uintptr_t i = (uintptr_t)d;
    return (i == 1 || i == 2) ? (int)i - 1 : -1;
}

static nvmlReturn_t copy(char *out, unsigned int len, const char *s)
{
    if (strlen(s) + 1 > len)
        return INSUFFICIENT_SIZE;
    strcpy(out, s);
    return OK;
}

nvmlReturn_t nvmlInit_v2(void)
{
#ifdef INIT_FAILS
    return DRIVER_MISMATCH;
#else
    initialized = 1;
    return OK;
#endif
}

nvmlReturn_t nvmlShutdown(void)
{
    initialized = 0;
    return OK;
}

const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NOT_SUPPORTED: return "Not Supported";
    case DRIVER_MISMATCH: return "Driver/library version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!initialized)
        return NOT_INITIALIZED;
    *count = 2;
    return OK;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
    if (i >= 2)
        return INVALID_ARGUMENT;
    *d = (nvmlDevice_t)(uintptr_t)(i + 1);
    return OK;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len)
{
    return index_of(d) < 0 ? INVALID_ARGUMENT : copy(name, len, "NVIDIA H100 80GB HBM3");
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len)
{
    static const char *uuids[] = { "GPU-0e6f8a21-3b5c-4d7e-8f90-a1b2c3d4e5f0",
                                   "GPU-1f708b32-4c6d-4e8f-9a01-b2c3d4e5f601" };
    int i = index_of(d);
    return i < 0 ? INVALID_ARGUMENT : copy(uuid, len, uuids[i]);
}

nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t d, char *v, unsigned int len)
{
    return index_of(d) < 0 ? INVALID_ARGUMENT : copy(v, len, "96.00.74.00.01");
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci)
{
    static const unsigned int buses[] = { 0x43, 0x1b };
    int i = index_of(d);
    if (i < 0)
        return INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    pci->domain = 0;
    pci->bus = buses[i];
    pci->pciDeviceId = 0x233010de;
    pci->pciSubSystemId = 0x16c110de;
    snprintf(pci->busId, sizeof(pci->busId), "00000000:%02X:00.0", buses[i]);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02X:00.0", buses[i]);
    return OK;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    if (index_of(d) < 0)
        return INVALID_ARGUMENT;
    m->total = 85520809984ULL;
    m->free = 84935770112ULL;
    m->used = m->total - m->free;
    return OK;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor)
{
    int i = index_of(d);
    if (i < 0)
        return INVALID_ARGUMENT;
    *minor = (unsigned int)i;
    return OK;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor)
{
    if (index_of(d) < 0)
        return INVALID_ARGUMENT;
    *major = 9;
    *minor = 0;
    return OK;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, int *active)
{
    int i = index_of(d);
    if (i < 0 || link >= 18)
        return INVALID_ARGUMENT;
    if (i == 1)
        return NOT_SUPPORTED;
    *active = 1;
    return OK;
}
