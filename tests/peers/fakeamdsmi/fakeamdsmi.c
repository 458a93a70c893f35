/* A fake libamd_smi.so for tests: the calls gpuscale's AMD backend makes, with the
 * structures and status codes of amdsmi 7.0.2 (amdsmi_wrapper.py, generated from
 * amdsmi.h), loaded by the unmodified `amdsmi` Python package. Every other symbol the
 * package binds at import is a stub answering AMDSMI_STATUS_NOT_SUPPORTED (stubs.c,
 * generated from the package's own symbol list by the test's build step).
 *
 * The node is described by the file named in FAKEAMDSMI_CONFIG, read at amdsmi_init
 * (one line a GPU or process; see __init__.py for the keys; rewritten under a running
 * process, it is read again at the next call):
 *   gpu idx=0 uuid=... bdf=0000:05:00.0 name="AMD Instinct MI300X" vram_total=196592 ...
 *   proc gpu=0 pid=4242 name=python3 vram=8589934592 gfx=123456
 * Quirks reproduced (from the package's own handling of them, amdsmi_interface.py):
 *   - a field the hardware cannot give inside a successful call is 0xFFFF ("N/A");
 *   - a call a GPU does not support answers AMDSMI_STATUS_NOT_SUPPORTED (key unsupported=
 *     activity,power,temp,vram,process,asic);
 *   - a GPU that fell off the bus answers AMDSMI_STATUS_NOT_FOUND to every call on it
 *     (key lost=1; lost_after=N: after N calls on it, so in the middle of a tick) - what
 *     amdsmi gives when the device's sysfs node is gone;
 *   - a process with a context on the GPU may be missing from the list, which still
 *     answers success (key hidden=1 on a process: never listed) - as the library's list
 *     comes out after a read error (emptied) or for another user's process it may not
 *     read;
 *   - a process's GFX engine time (gfx=) is the DRM scheduler's (fdinfo): compute work
 *     on the KFD's queues never adds to it, so it says nothing of a ROCm program's use;
 *   - calls before amdsmi_init answer AMDSMI_STATUS_NOT_INIT; amdsmi_init without
 *     AMDSMI_INIT_AMD_GPUS finds no GPU sockets; FAKEAMDSMI_DRIVER=absent makes
 *     amdsmi_init answer AMDSMI_STATUS_DRIVER_NOT_LOADED;
 *   - power_limit inside amdsmi_power_info_t is the hwmon power1_cap in microwatts
 *     (ROCm/amdsmi#174), though amdsmi.h's comment says watts: power_limit= on a line is
 *     in watts and written as uW; power_limit_uw= writes a raw value (a stack that gave
 *     watts after all);
 *   - VRAM used: a booted GPU always has some in use (the kernel's own allocations), so
 *     vram_used defaults to 284 MiB (what an idle MI300X reads in ROCm issue 4750); when
 *     reading the used counter fails while the total succeeds, rocm_smi answers SUCCESS
 *     with used = 0 (key used_read_fails=1);
 *   - the enumeration is fixed at amdsmi_init: a config rewritten under a running process
 *     (a repartition) changes what the enumerated handles answer, adds no processor, and a
 *     handle whose processor is gone answers AMDSMI_STATUS_NOT_FOUND until the library is
 *     initialised again;
 *   - amdsmi_get_lib_version gives FAKEAMDSMI_LIB_VERSION ("26.0.2" unless set; the
 *     number is illustrative). A symbol the package binds can be left out of the library
 *     altogether (build(missing=...) in __init__.py): an older library than the package.
 * Partitions (an MI300X in CPX mode is 8 processors on one socket): processors with the
 * same socket= key are one physical GPU, enumerated under one socket handle in the order
 * of their partition= (the KFD's current_partition_id). Each has its own UUID, render
 * node (render=, what amdsmi_get_gpu_enumeration_info gives as drm_render), VRAM and
 * process list; the compute and memory partition modes (compute=CPX memory=NPS1) are the
 * physical GPU's. Quirks: GPU activity (amdsmi_get_gpu_activity) is the physical GPU's
 * average on every partition's handle - never one partition's; a partition's own GFX
 * busy share is only in the GPU metrics table (xcp_stats[partition].gfx_busy_inst, one
 * entry per XCC it holds; busy= on its line), the same table on every handle of the
 * socket; older KFDs put the partition ID in the BDF's function (bdf=0000:05:00.3), newer
 * ones give every partition the GPU's BDF - both are just the bdf= of each line. The
 * table's accumulators: the accumulation counter counts cycles (a millisecond each here)
 * and each XCC's gfx_busy_acc adds its busy share each cycle (busy_avg=: a partition whose
 * instantaneous share, busy=, caught a quiet moment) - our reading of "Utilization
 * Accumulated (%)" in amdsmi.h, to be checked on hardware. The table's num_partition is the
 * GPU's current number of partitions (its lines in the config, enumerated or not).
 * VRAM of partitions (key vram_report= on each partition's line): "own" (default) - each
 * handle answers its own partition's vram_total/vram_used; "gpu" - every handle answers
 * the whole GPU's pool, the sums over all partitions of its socket (ROCm 6.3.3, ROCm issue
 * 4750); "pool" - every handle answers its memory partition's pool (memory=NPS4: the
 * partitions p with the same p / (N / 4)).
 * UUIDs: each line's uuid=; before ROCm 7.12 every partition of a GPU answers the same
 * one (partitioned_gpu(shared_uuid=True) writes it so).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "gpu_metrics.h" /* generated from the installed package (see __init__.py) */

#define S_SUCCESS 0
#define S_INVAL 1
#define S_NOT_SUPPORTED 2
#define S_NOT_FOUND 31
#define S_NOT_INIT 32
#define S_DRIVER_NOT_LOADED 34
#define S_INSUFFICIENT_SIZE 41
#define INIT_AMD_GPUS 2
#define MAX_GPUS 64
#define MAX_PROCS 256
#define NA 0xFFFF

typedef struct {
    uint32_t vram_total, vram_used, reserved[2];
} vram_usage_t;

typedef struct {
    uint32_t gfx_activity, umc_activity, mm_activity, reserved[13];
} engine_usage_t;

typedef struct {
    uint64_t socket_power;
    uint32_t current_socket_power, average_socket_power;
    uint64_t gfx_voltage, soc_voltage, mem_voltage;
    uint32_t power_limit;
    uint8_t padding[4];
    uint64_t reserved[18];
} power_info_t;

typedef struct {
    char market_name[256];
    uint32_t vendor_id;
    char vendor_name[256];
    uint32_t subvendor_id;
    uint64_t device_id;
    uint32_t rev_id;
    char asic_serial[256];
    uint32_t oam_id, num_of_compute_units;
    uint8_t padding[4];
    uint64_t target_graphics_version;
    uint32_t subsystem_id, reserved[21];
} asic_info_t;

#pragma pack(push, 1)
typedef struct {
    char name[256];
    uint32_t pid;
    uint8_t padding[4];
    uint64_t mem;
    struct { uint64_t gfx, enc; uint32_t reserved[12]; } engine_usage;
    struct { uint64_t gtt_mem, cpu_mem, vram_mem; uint32_t reserved[10]; } memory_usage;
    char container_name[256];
    uint32_t cu_occupancy, reserved[11];
} proc_info_t;
#pragma pack(pop)

typedef struct {
    int present, lost, socket, partition, render;
    long calls, lost_after; /* lost once this many calls on it were answered (0: never) */
    char uuid[256], name[256], serial[256], unsupported[264], compute[16], memory[16];
    unsigned domain, bus, device, function;
    uint32_t vram_total, vram_used, gfx, umc, mm, power, power_limit, busy, busy_avg;
    uint64_t vram_used_bytes, power_limit_uw;
    int64_t temp;
    int used_read_fails;
    char vram_report[8];
} gpu_t;

typedef struct {
    uint64_t kfd_id;
    uint32_t node_id, current_partition_id, reserved[12];
} kfd_info_t;

#pragma pack(push, 1)
typedef struct {
    uint32_t drm_render, drm_card, hsa_id, hip_id;
    char hip_uuid[256];
} enumeration_info_t;
#pragma pack(pop)

typedef struct {
    int gpu, hidden;
    uint32_t pid;
    uint64_t vram, gfx;
    char name[256];
} proc_t;

static gpu_t gpus[MAX_GPUS];
static proc_t procs[MAX_PROCS];
static int ngpus, nprocs, initialized;
static int nenumerated; /* processors enumerated at init: their handles stay valid */
static int nconfigured; /* processors in the config as last read (the GPUs' truth) */
static struct timespec initialized_at; /* the accumulators count from here */
static struct timespec loaded_at; /* the config file's mtime when last read */
/* A socket handle is the address of its slot here (slot i: the i-th distinct socket= in
 * the file), a processor handle the address of its gpu_t. */
static int sockets[MAX_GPUS];
static int socket_ids[MAX_GPUS], nsockets;

static const char *value_of(const char *line, const char *key, char *out, size_t size) {
    size_t klen = strlen(key);
    const char *p = line;
    while ((p = strstr(p, key)) != NULL) {
        if ((p == line || p[-1] == ' ') && p[klen] == '=') {
            p += klen + 1;
            size_t n = 0;
            if (*p == '"') {
                p++;
                while (p[n] && p[n] != '"' && n + 1 < size) n++;
            } else {
                while (p[n] && p[n] != ' ' && p[n] != '\n' && n + 1 < size) n++;
            }
            memcpy(out, p, n);
            out[n] = 0;
            return out;
        }
        p += klen;
    }
    return NULL;
}

static uint64_t num(const char *line, const char *key, uint64_t fallback) {
    char buf[64];
    return value_of(line, key, buf, sizeof buf) ? strtoull(buf, NULL, 0) : fallback;
}

static void load(void) {
    struct stat st;
    const char *cfg = getenv("FAKEAMDSMI_CONFIG");
    if (cfg && stat(cfg, &st) == 0) loaded_at = st.st_mtim;
    ngpus = nprocs = 0;
    memset(gpus, 0, sizeof gpus);
    memset(procs, 0, sizeof procs);
    const char *path = getenv("FAKEAMDSMI_CONFIG");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return;
    char line[1024], buf[256];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "gpu ", 4) == 0 && ngpus < MAX_GPUS) {
            gpu_t *g = &gpus[ngpus++];
            g->present = 1;
            g->lost = (int)num(line, "lost", 0);
            g->lost_after = (long)num(line, "lost_after", 0);
            snprintf(g->uuid, sizeof g->uuid, "%s",
                     value_of(line, "uuid", buf, sizeof buf) ? buf : "");
            snprintf(g->name, sizeof g->name, "%s",
                     value_of(line, "name", buf, sizeof buf) ? buf : "AMD Instinct MI300X");
            snprintf(g->serial, sizeof g->serial, "%s",
                     value_of(line, "serial", buf, sizeof buf) ? buf : "");
            snprintf(g->unsupported, sizeof g->unsupported, ",%s,",
                     value_of(line, "unsupported", buf, sizeof buf) ? buf : "");
            if (!value_of(line, "bdf", buf, sizeof buf) ||
                sscanf(buf, "%x:%x:%x.%x", &g->domain, &g->bus, &g->device,
                       &g->function) != 4) {
                g->domain = 0; g->bus = (unsigned)(5 + ngpus); g->device = 0; g->function = 0;
            }
            g->vram_total = (uint32_t)num(line, "vram_total", 196592);
            g->vram_used = (uint32_t)num(line, "vram_used", 284);
            g->used_read_fails = (int)num(line, "used_read_fails", 0);
            snprintf(g->vram_report, sizeof g->vram_report, "%.7s",
                     value_of(line, "vram_report", buf, sizeof buf) ? buf : "own");
            g->vram_used_bytes = num(line, "vram_used_bytes", 0);
            g->gfx = (uint32_t)num(line, "gfx", 0);
            g->umc = (uint32_t)num(line, "umc", 0);
            g->mm = (uint32_t)num(line, "mm", NA);
            g->power = (uint32_t)num(line, "power", 150);
            g->power_limit = (uint32_t)num(line, "power_limit", 750);
            g->power_limit_uw = num(line, "power_limit_uw", (uint64_t)g->power_limit * 1000000u);
            g->temp = (int64_t)num(line, "temp", 40);
            g->socket = (int)num(line, "socket", (uint64_t)(ngpus - 1));
            g->partition = (int)num(line, "partition", 0);
            g->render = (int)num(line, "render", (uint64_t)(127 + ngpus));
            g->busy = (uint32_t)num(line, "busy", 0xFFFFFFFFu);
            g->busy_avg = (uint32_t)num(line, "busy_avg", g->busy);
            snprintf(g->compute, sizeof g->compute, "%.15s",
                     value_of(line, "compute", buf, sizeof buf) ? buf : "SPX");
            snprintf(g->memory, sizeof g->memory, "%.15s",
                     value_of(line, "memory", buf, sizeof buf) ? buf : "NPS1");
        } else if (strncmp(line, "proc ", 5) == 0 && nprocs < MAX_PROCS) {
            proc_t *p = &procs[nprocs++];
            p->gpu = (int)num(line, "gpu", 0);
            p->pid = (uint32_t)num(line, "pid", 0);
            p->vram = num(line, "vram", 0);
            p->gfx = num(line, "gfx", 0);
            p->hidden = (int)num(line, "hidden", 0);
            snprintf(p->name, sizeof p->name, "%s",
                     value_of(line, "name", buf, sizeof buf) ? buf : "");
        }
    }
    fclose(f);
    nconfigured = ngpus;
}

/* The distinct sockets, in the order of their first processor. */
static void index_sockets(void) {
    nsockets = 0;
    for (int i = 0; i < ngpus; i++) {
        int seen = 0;
        for (int k = 0; k < nsockets; k++) seen |= socket_ids[k] == gpus[i].socket;
        if (!seen) socket_ids[nsockets++] = gpus[i].socket;
    }
}

static gpu_t *gpu_of(void *handle) {
    for (int i = 0; i < ngpus; i++)
        if (handle == &gpus[i]) return &gpus[i];
    return NULL;
}

/* A handle enumerated at init whose processor is gone since (repartitioned away). */
static int stale(void *handle) {
    for (int i = ngpus; i < nenumerated; i++)
        if (handle == &gpus[i]) return 1;
    return 0;
}

/* A test may rewrite the config under a running process: read it again when its mtime
 * changed (the GPUs stay at their addresses, so handles stay valid). */
static void reload_if_changed(void) {
    struct stat st;
    const char *cfg = getenv("FAKEAMDSMI_CONFIG");
    if (!cfg || stat(cfg, &st) != 0) return;
    if (st.st_mtim.tv_sec != loaded_at.tv_sec || st.st_mtim.tv_nsec != loaded_at.tv_nsec) {
        load();
        if (ngpus > nenumerated) ngpus = nenumerated; /* fixed at init, as the library's */
    }
}

/* The status of a call on GPU ``h`` for ``field``: not initialized, unknown handle,
 * lost, unsupported, or success. */
static int check(void *h, const char *field, gpu_t **out) {
    if (!initialized) return S_NOT_INIT;
    reload_if_changed();
    gpu_t *g = gpu_of(h);
    if (!g) return stale(h) ? S_NOT_FOUND : S_INVAL;
    g->calls++;
    if (g->lost_after && g->calls > g->lost_after) g->lost = 1;
    if (g->lost) return S_NOT_FOUND;
    char key[64];
    snprintf(key, sizeof key, ",%s,", field);
    if (strstr(g->unsupported, key)) return S_NOT_SUPPORTED;
    *out = g;
    return S_SUCCESS;
}

int amdsmi_init(uint64_t flags) {
    const char *driver = getenv("FAKEAMDSMI_DRIVER");
    if (driver && strcmp(driver, "absent") == 0) return S_DRIVER_NOT_LOADED;
    load();
    if (!(flags & INIT_AMD_GPUS)) ngpus = 0;
    index_sockets();
    nenumerated = ngpus;
    clock_gettime(CLOCK_MONOTONIC, &initialized_at);
    initialized = 1;
    return S_SUCCESS;
}

int amdsmi_shut_down(void) {
    if (!initialized) return S_NOT_INIT;
    initialized = 0;
    return S_SUCCESS;
}

int amdsmi_get_socket_handles(uint32_t *count, void **handles) {
    if (!initialized) return S_NOT_INIT;
    if (!count) return S_INVAL;
    if (handles) {
        if (*count < (uint32_t)nsockets) return S_INSUFFICIENT_SIZE;
        for (int i = 0; i < nsockets; i++) handles[i] = &sockets[i];
    }
    *count = (uint32_t)nsockets;
    return S_SUCCESS;
}

int amdsmi_get_processor_handles(void *socket, uint32_t *count, void **handles) {
    if (!initialized) return S_NOT_INIT;
    if (!count) return S_INVAL;
    long i = (int *)socket - sockets;
    if (i < 0 || i >= nsockets) return S_INVAL;
    uint32_t n = 0;
    for (int part = 0; part < 8; part++)  /* in partition order, as the KFD numbers them */
        for (int k = 0; k < ngpus; k++) {
            if (gpus[k].socket != socket_ids[i] || gpus[k].partition != part) continue;
            if (handles && n < *count) handles[n] = &gpus[k];
            n++;
        }
    if (handles && n > *count) {
        *count = n;
        return S_INSUFFICIENT_SIZE;
    }
    *count = n;
    return S_SUCCESS;
}

int amdsmi_get_gpu_device_uuid(void *h, uint32_t *length, char *uuid) {
    gpu_t *g;
    int s = check(h, "uuid", &g);
    if (s) return s;
    if (!length || !uuid) return S_INVAL;
    if (*length < strlen(g->uuid) + 1) return S_INSUFFICIENT_SIZE;
    snprintf(uuid, *length, "%s", g->uuid);
    *length = (uint32_t)strlen(g->uuid);
    return S_SUCCESS;
}

int amdsmi_get_gpu_device_bdf(void *h, uint64_t *bdf) {
    gpu_t *g;
    int s = check(h, "bdf", &g);
    if (s) return s;
    /* function:3, device:5, bus:8, domain:48, as amdsmi_bdf_t's bit fields */
    *bdf = (uint64_t)(g->function & 7) | ((uint64_t)(g->device & 31) << 3) |
           ((uint64_t)(g->bus & 255) << 8) | ((uint64_t)g->domain << 16);
    return S_SUCCESS;
}

int amdsmi_get_gpu_asic_info(void *h, asic_info_t *info) {
    gpu_t *g;
    int s = check(h, "asic", &g);
    if (s) return s;
    memset(info, 0, sizeof *info);
    snprintf(info->market_name, sizeof info->market_name, "%s", g->name);
    snprintf(info->vendor_name, sizeof info->vendor_name, "Advanced Micro Devices Inc. [AMD/ATI]");
    info->vendor_id = 0x1002;
    info->subvendor_id = 0x1002;
    info->device_id = 0x74a1;
    snprintf(info->asic_serial, sizeof info->asic_serial, "%s", g->serial);
    info->oam_id = (uint32_t)(g - gpus);
    info->num_of_compute_units = 304;
    info->target_graphics_version = 0x942;
    info->subsystem_id = 0x74a1;
    return S_SUCCESS;
}

int amdsmi_get_gpu_activity(void *h, engine_usage_t *usage) {
    gpu_t *g;
    int s = check(h, "activity", &g);
    if (s) return s;
    memset(usage, 0, sizeof *usage);
    usage->gfx_activity = g->gfx;
    usage->umc_activity = g->umc;
    usage->mm_activity = g->mm;
    return S_SUCCESS;
}

/* Whether processor k's VRAM is in what g's handle reports (vram_report=, see above). */
static int reported_with(const gpu_t *g, const gpu_t *k) {
    if (strcmp(g->vram_report, "gpu") != 0 && strcmp(g->vram_report, "pool") != 0)
        return k == g;
    if (k->socket != g->socket) return 0;
    if (strcmp(g->vram_report, "gpu") == 0) return 1;
    int parts = 0, nps = 1;
    for (int i = 0; i < nconfigured; i++) parts += gpus[i].socket == g->socket;
    if (strncmp(g->memory, "NPS", 3) == 0) nps = atoi(g->memory + 3);
    int per = nps > 0 && parts >= nps ? parts / nps : 1;
    return k->partition / per == g->partition / per;
}

/* VRAM total and used in bytes as g's handle reports them. */
static void vram_of(const gpu_t *g, uint64_t *total, uint64_t *used) {
    *total = *used = 0;
    for (int i = 0; i < nconfigured; i++) {
        const gpu_t *k = &gpus[i];
        if (!reported_with(g, k)) continue;
        *total += (uint64_t)k->vram_total * 1048576u;
        *used += k->vram_used_bytes ? k->vram_used_bytes : (uint64_t)k->vram_used * 1048576u;
    }
    if (g->used_read_fails) *used = 0; /* rocm_smi: SUCCESS, and 0 */
}

int amdsmi_get_gpu_vram_usage(void *h, vram_usage_t *vram) {
    gpu_t *g;
    int s = check(h, "vram", &g);
    if (s) return s;
    uint64_t total, used;
    vram_of(g, &total, &used);
    memset(vram, 0, sizeof *vram);
    vram->vram_total = (uint32_t)(total / 1048576u);
    vram->vram_used = (uint32_t)(used / 1048576u);
    return S_SUCCESS;
}

/* VRAM in bytes (AMDSMI_MEM_TYPE_VRAM = 0): vram_used_bytes= gives a size that is not a
 * whole MiB (what amdsmi_get_gpu_vram_usage rounds down). */
int amdsmi_get_gpu_memory_total(void *h, int type, uint64_t *total) {
    gpu_t *g;
    int s = check(h, "vram", &g);
    if (s) return s;
    if (type != 0) return S_NOT_SUPPORTED;
    uint64_t used;
    vram_of(g, total, &used);
    return S_SUCCESS;
}

int amdsmi_get_gpu_memory_usage(void *h, int type, uint64_t *used) {
    gpu_t *g;
    int s = check(h, "vram", &g);
    if (s) return s;
    if (type != 0) return S_NOT_SUPPORTED;
    uint64_t total;
    vram_of(g, &total, used);
    return S_SUCCESS;
}

int amdsmi_get_power_info(void *h, power_info_t *info) {
    gpu_t *g;
    int s = check(h, "power", &g);
    if (s) return s;
    memset(info, 0, sizeof *info);
    info->socket_power = g->power;
    info->current_socket_power = g->power;
    info->average_socket_power = NA; /* MI300: only the current reading */
    info->gfx_voltage = info->soc_voltage = info->mem_voltage = NA;
    info->power_limit = (uint32_t)g->power_limit_uw; /* uW: the hwmon cap, unchanged */
    return S_SUCCESS;
}

int amdsmi_get_temp_metric(void *h, int sensor, int metric, int64_t *value) {
    gpu_t *g;
    int s = check(h, "temp", &g);
    if (s) return s;
    if (metric != 0) return S_NOT_SUPPORTED;       /* only AMDSMI_TEMP_CURRENT */
    if (sensor == 0) return S_NOT_SUPPORTED;       /* MI300X has no edge sensor */
    *value = g->temp;
    return S_SUCCESS;
}

int amdsmi_get_gpu_process_list(void *h, uint32_t *max, proc_info_t *list) {
    gpu_t *g;
    int s = check(h, "process", &g);
    if (s) return s;
    if (!max) return S_INVAL;
    uint32_t n = 0;
    int gi = (int)(g - gpus);
    for (int i = 0; i < nprocs; i++) {
        if (procs[i].gpu != gi || procs[i].hidden) continue;
        if (list && n < *max) {
            proc_info_t *p = &list[n];
            memset(p, 0, sizeof *p);
            snprintf(p->name, sizeof p->name, "%s", procs[i].name);
            p->pid = procs[i].pid;
            p->mem = procs[i].vram;
            p->engine_usage.gfx = procs[i].gfx;
            p->memory_usage.vram_mem = procs[i].vram;
            p->cu_occupancy = 0xFFFFFFFFu;
        }
        n++;
    }
    if (list && n > *max) {
        *max = n;
        return S_INSUFFICIENT_SIZE;
    }
    *max = n;
    return S_SUCCESS;
}

int amdsmi_get_gpu_kfd_info(void *h, kfd_info_t *info) {
    gpu_t *g;
    int s = check(h, "kfd", &g);
    if (s) return s;
    memset(info, 0, sizeof *info);
    info->kfd_id = 0x7000u + (uint64_t)(g - gpus);
    info->node_id = (uint32_t)(g - gpus) + 1; /* node 0 is the CPU */
    info->current_partition_id = (uint32_t)g->partition;
    return S_SUCCESS;
}

int amdsmi_get_gpu_enumeration_info(void *h, enumeration_info_t *info) {
    gpu_t *g;
    int s = check(h, "enumeration", &g);
    if (s) return s;
    memset(info, 0, sizeof *info);
    info->drm_render = (uint32_t)g->render;
    info->drm_card = (uint32_t)g->render - 128;
    info->hsa_id = info->hip_id = (uint32_t)(g - gpus);
    snprintf(info->hip_uuid, sizeof info->hip_uuid, "GPU-%.240s", g->uuid);
    return S_SUCCESS;
}

static int partition_string(void *h, const char *field, int memory, char *out, uint32_t len) {
    gpu_t *g;
    int s = check(h, field, &g);
    if (s) return s;
    const char *v = memory ? g->memory : g->compute;
    if (!out || len < strlen(v) + 1) return S_INSUFFICIENT_SIZE;
    snprintf(out, len, "%s", v);
    return S_SUCCESS;
}

int amdsmi_get_gpu_compute_partition(void *h, char *out, uint32_t len) {
    return partition_string(h, "partition", 0, out, len);
}

int amdsmi_get_gpu_memory_partition(void *h, char *out, uint32_t len) {
    return partition_string(h, "partition", 1, out, len);
}

/* The physical GPU's metrics table, whichever of its partitions is asked: every field
 * the fake does not model is all ones (the library's "not available"). */
int amdsmi_get_gpu_metrics_info(void *h, struct_amdsmi_gpu_metrics_t *m) {
    gpu_t *g;
    int s = check(h, "metrics", &g);
    if (s) return s;
    memset(m, 0xFF, sizeof *m);
    m->common_header.structure_size = (uint16_t)sizeof *m;
    m->common_header.format_revision = 1;
    m->common_header.content_revision = 8;
    m->temperature_hotspot = (uint16_t)g->temp;
    m->average_gfx_activity = (uint16_t)g->gfx;
    m->average_umc_activity = (uint16_t)g->umc;
    /* Accumulators: one accumulation cycle a millisecond since init; each XCC's busy
     * accumulator adds its busy share (busy_avg=, else busy=) every cycle. */
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint64_t cycles = (uint64_t)(now.tv_sec - initialized_at.tv_sec) * 1000u +
                      (uint64_t)((now.tv_nsec - initialized_at.tv_nsec) / 1000000);
    m->accumulation_counter = cycles + 1;
    int parts = 0; /* the GPU's partitions now, enumerated or not */
    for (int k = 0; k < nconfigured; k++) parts += gpus[k].socket == g->socket;
    m->num_partition = (uint16_t)parts;
    int xccs = parts > 0 && parts <= 8 ? 8 / parts : 1; /* an MI300X has 8 XCCs */
    for (int k = 0; k < nconfigured; k++) {
        if (gpus[k].socket != g->socket || gpus[k].partition < 0 || gpus[k].partition >= 8)
            continue;
        for (int x = 0; x < xccs; x++) {
            m->xcp_stats[gpus[k].partition].gfx_busy_inst[x] = gpus[k].busy;
            if (gpus[k].busy_avg <= 100)
                m->xcp_stats[gpus[k].partition].gfx_busy_acc[x] =
                    (uint64_t)gpus[k].busy_avg * (cycles + 1);
        }
    }
    return S_SUCCESS;
}

typedef struct {
    uint32_t major, minor, release;
    uint8_t padding[4];
    const char *build;
} lib_version_t;

/* Needs no amdsmi_init, as the library's. */
int amdsmi_get_lib_version(lib_version_t *v) {
    const char *text = getenv("FAKEAMDSMI_LIB_VERSION");
    if (!v) return S_INVAL;
    memset(v, 0, sizeof *v);
    if (sscanf(text ? text : "26.0.2", "%u.%u.%u", &v->major, &v->minor, &v->release) != 3)
        return S_INVAL;
    v->build = "fake";
    return S_SUCCESS;
}
