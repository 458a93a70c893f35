/*
 * A fake libnvidia-ml.so.1 for tests: the NVML C ABI that nvidia-ml-py calls, answered from
 * a scenario file. Built at test time (soname libnvidia-ml.so.1) and loaded by the
 * unmodified bindings through LD_LIBRARY_PATH.
 *
 * The scenario file is named by $FAKENVML_SCENARIO and re-read whenever its mtime or size
 * changes (set $FAKENVML_STATIC=1 to read it once), so a test can change the GPUs under a
 * running process: lose a GPU, unload the driver, add an XID event.
 *
 * Format: one record per line, "kind key=value ...", values may be "quoted"; '#' comments.
 *   global init_error=0 all_error=0 driver=550.54.15 count=<n, default: gpu lines>
 *       clock_us=<epoch us: the driver's clock stands there; default: the real clock>
 *   gpu idx=0 uuid=GPU-.. name="NVIDIA H100 80GB HBM3" pci=00000000:18:00.0 minor=0
 *       mem_total=<B> mem_used=<B> mem_reserved=<B> util=30,70 mem_util=20 power_mw=
 *       limit_mw= temp= sm_clock= energy_mj= nvlink_kib_s=<-1: unsupported> pcie_kb_s=
 *       mig=0|1 gpm=0|1 lost=0|1 lost_after=<reading|any>:<n> xid=<code>:<count>
 *       sample_us=166667 unsupported=<reading>,.. fail=<reading>:<code>,..
 *       mps_server=<pid of its MPS server> mps_server_sm=<the server's own per-process sm %>
 *   mig gpu=0 idx=0 uuid=MIG-.. gi=1 ci=0 gslices=3 cslices=3 mem_mb=40192 mem_used=<B>
 *       gpm_util=55
 *   proc gpu=0 mig=<idx, optional> pid=1234 mem=<B> sm=55 memutil=20 idle=0|1
 *       ctx=compute|graphics|both was=<sm before> for_ms=<how long it has been sm/idle>
 *       mps=1 (an MPS client: its compute context is an MPS one)
 * Reading names for unsupported/fail: samples util_rates memory memory_v2 power limit temp clock
 * energy nvlink pcie processes graphics mps proc_util mig_mode mig_handle minor events.
 *
 * Quirks of the real driver reproduced here (a kinder fake hides the bugs that matter). Where
 * the NVML reference and a real H100 (driver 580.159.04, see the trust issue) differ, the
 * fake does what the H100 did:
 * - nvmlDeviceGetProcessUtilization gives at most one entry per process: its mean activity
 *   over the sample periods since lastSeenTimeStamp (idle periods count as 0), stamped with
 *   its newest active period on the same grid as nvmlDeviceGetSamples. A process that did no
 *   work since then (idle=1, or sm=0 and memutil=0) is listed as running but has no entry;
 *   with no entry at all the call fails NVML_ERROR_NOT_FOUND. lastSeenTimeStamp=0 averages
 *   the whole per-process window (72 periods, ~14 s on the H100, clipped to the process's
 *   life), which is not the current load. The sizing call (NULL buffer) always answers
 *   NVML_ERROR_INSUFFICIENT_SIZE with the buffer's capacity (72), even with no process.
 *   A process's activity has one step of history: was=<sm> for_ms=<n> says it ran at sm
 *   `was` until n ms before the scenario was loaded; a rewrite that changes a pid's sm or
 *   idle makes the old value its `was` from that moment.
 * - On MIG (a MIG handle, or the parent in MIG mode) device utilization, utilization samples
 *   and per-process utilization are NVML_ERROR_NOT_SUPPORTED; GPM only where gpm=1.
 * - MPS (NVIDIA's MPS doc: "nvidia-cuda-mps-server will appear as the active CUDA process
 *   rather than any of the client processes"): an MPS client (mps=1) is listed by
 *   nvmlDeviceGetMPSComputeRunningProcesses_v3, not by the compute listing, which lists the
 *   MPS server (pid mps_server, 32 MiB) on a device while any MPS client is on it. The NVML
 *   reference says only "processes with a Multi-Process Service (MPS) compute context"; it
 *   does not say how nvmlDeviceGetProcessUtilization samples MPS clients. The fake gives
 *   each client its own entry, as for any process, and the server an entry only when
 *   mps_server_sm > 0 (a driver that books its clients' work to the server instead).
 * - A GPU can fall off the bus in the middle of a tick: with lost_after=<reading>:<n> the
 *   n-th call of that reading ("any": of any call on the GPU) and every call after it return
 *   NVML_ERROR_GPU_IS_LOST, as lost=1 does from the start, until the scenario is rewritten.
 *
 * Compile with -DFAKENVML_OLD_DRIVER to leave out the entry points newer than R510
 * (nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGet{Compute,Graphics,MPSCompute}RunningProcesses_v3,
 * nvmlDeviceGetSamples and GPM), as an older driver would.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
  OK = 0, E_UNINIT = 1, E_INVALID = 2, E_NOT_SUPPORTED = 3, E_NOT_FOUND = 6,
  E_INSUFFICIENT_SIZE = 7, E_TIMEOUT = 10, E_GPU_LOST = 15, E_ARG_VERSION = 25
};
#define MAX_GPUS 16
#define MAX_MIGS 7
#define MAX_PROCS 512
#define SAMPLE_BUF 120
#define PROC_BUF 72  /* per-process periods the driver keeps (and sizes its answer to) */
#define MAX_VALUES 16

typedef struct fake_dev { int is_mig, gpu, mig; } fake_dev;
typedef fake_dev *nvmlDevice_t;

typedef struct {
  char reading[32];
  int code;
} fault_t;

typedef struct {
  int present;
  char uuid[96], name[96], pci[32];
  unsigned minor;
  unsigned long long mem_total, mem_used, mem_reserved;
  unsigned util[MAX_VALUES]; int n_util;
  unsigned mem_util, power_mw, limit_mw, temp, sm_clock;
  unsigned long long energy_mj;
  long long nvlink_kib_s, pcie_kb_s;
  int mig, gpm, lost, xid_code, xid_count;
  char lost_reading[32]; long long lost_after, lost_calls;  /* lost_after=<reading>:<n> */
  long long sample_us;
  unsigned mps_server, mps_server_sm;  /* the MPS server's pid; its own per-process sm % */
  fault_t faults[16]; int n_faults;
} gpu_t;

typedef struct {
  int present;
  char uuid[96];
  unsigned gi, ci, gslices, cslices, mem_mb, gpm_util;
  unsigned long long mem_used;
} mig_t;

enum { CTX_COMPUTE = 1, CTX_GRAPHICS = 2, CTX_MPS = 4 };
typedef struct {
  int gpu, mig, idle, ctx; unsigned pid; unsigned long long mem; unsigned sm, memutil;
  int was; long long since_us; unsigned was_mem;  /* was < 0: no history, always as now */
} proc_t;

static struct {
  int init_error, all_error, count;
  long long clock_us;
  char driver[80];
  gpu_t gpus[MAX_GPUS];
  mig_t migs[MAX_GPUS][MAX_MIGS];
  proc_t procs[MAX_PROCS]; int n_procs;
} S;

static fake_dev gpu_handles[MAX_GPUS];
static fake_dev mig_handles[MAX_GPUS][MAX_MIGS];
static int xid_delivered[MAX_GPUS];
static int initialized;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct timespec loaded_mtime; static off_t loaded_size = -1;
static long long loaded_at_us;

static long long now_us(void) {
  if (S.clock_us) return S.clock_us;  /* a test's frozen clock: the sample grid stands */
  struct timespec ts; clock_gettime(CLOCK_REALTIME, &ts);
  return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

/* --- scenario parsing ---------------------------------------------------------------- */

static char *next_token(char **p) {
  char *s = *p;
  while (*s == ' ' || *s == '\t') s++;
  if (!*s || *s == '\n' || *s == '#') return NULL;
  char *start = s, *out = s;
  int quoted = 0;
  while (*s && *s != '\n' && (quoted || (*s != ' ' && *s != '\t'))) {
    if (*s == '"') { quoted = !quoted; s++; continue; }
    *out++ = *s++;
  }
  if (*s) s++;
  *out = 0;
  *p = s;
  return start;
}

static void parse_faults(gpu_t *g, const char *v, int with_code) {
  char buf[512]; snprintf(buf, sizeof buf, "%s", v);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && g->n_faults < 16;
       t = strtok_r(NULL, ",", &save)) {
    fault_t *f = &g->faults[g->n_faults++];
    char *colon = strchr(t, ':');
    if (colon) *colon = 0;
    snprintf(f->reading, sizeof f->reading, "%s", t);
    f->code = with_code && colon ? atoi(colon + 1) : E_NOT_SUPPORTED;
  }
}

typedef struct { char key[64], value[256]; } kv_t;

static const char *lookup(const kv_t *kv, int n, const char *name) {
  const char *v = NULL;
  for (int i = 0; i < n; i++)
    if (!strcmp(kv[i].key, name)) v = kv[i].value;
  return v;
}

static void parse_line(char *line) {
  char *p = line, *kind = next_token(&p), *tok;
  if (!kind) return;
  kv_t kv[64]; int n = 0;
  while ((tok = next_token(&p)) && n < 64) {
    char *eq = strchr(tok, '=');
    if (!eq) continue;
    *eq = 0;
    snprintf(kv[n].key, sizeof kv[n].key, "%s", tok);
    snprintf(kv[n].value, sizeof kv[n].value, "%s", eq + 1);
    n++;
  }
#define GET(name) lookup(kv, n, name)
#define NUM(name, dflt) (GET(name) ? strtoll(GET(name), NULL, 10) : (dflt))
  if (!strcmp(kind, "global")) {
    S.init_error = NUM("init_error", 0);
    S.all_error = NUM("all_error", 0);
    S.count = NUM("count", -1);
    S.clock_us = NUM("clock_us", 0);
    if (GET("driver")) snprintf(S.driver, sizeof S.driver, "%s", GET("driver"));
  } else if (!strcmp(kind, "gpu")) {
    int i = NUM("idx", -1);
    if (i < 0 || i >= MAX_GPUS) return;
    gpu_t *g = &S.gpus[i];
    memset(g, 0, sizeof *g);
    g->present = 1;
    snprintf(g->uuid, sizeof g->uuid, "%s", GET("uuid") ? GET("uuid") : "GPU-00000000");
    snprintf(g->name, sizeof g->name, "%s", GET("name") ? GET("name") : "NVIDIA Fake");
    snprintf(g->pci, sizeof g->pci, "%s", GET("pci") ? GET("pci") : "00000000:00:00.0");
    g->minor = NUM("minor", i);
    g->mem_total = NUM("mem_total", 85899345920LL);
    g->mem_used = NUM("mem_used", 0);
    g->mem_reserved = NUM("mem_reserved", 536870912LL);
    const char *u = GET("util") ? GET("util") : "0";
    char buf[256]; snprintf(buf, sizeof buf, "%s", u);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && g->n_util < MAX_VALUES;
         t = strtok_r(NULL, ",", &save))
      g->util[g->n_util++] = atoi(t);
    g->mem_util = NUM("mem_util", 0);
    g->power_mw = NUM("power_mw", 100000);
    g->limit_mw = NUM("limit_mw", 700000);
    g->temp = NUM("temp", 40);
    g->sm_clock = NUM("sm_clock", 1980);
    g->energy_mj = NUM("energy_mj", 1000000);
    g->nvlink_kib_s = NUM("nvlink_kib_s", -1);
    g->pcie_kb_s = NUM("pcie_kb_s", 1000);
    g->mig = NUM("mig", 0);
    g->gpm = NUM("gpm", 0);
    g->lost = NUM("lost", 0);
    g->sample_us = NUM("sample_us", 166667);
    g->mps_server = NUM("mps_server", 4100000 + i);
    g->mps_server_sm = NUM("mps_server_sm", 0);
    if (GET("xid")) {
      g->xid_code = atoi(GET("xid"));
      const char *c = strchr(GET("xid"), ':');
      g->xid_count = c ? atoi(c + 1) : 1;
    }
    if (GET("lost_after")) {
      const char *v = GET("lost_after"), *c = strchr(v, ':');
      snprintf(g->lost_reading, sizeof g->lost_reading, "%.*s", (int)(c ? c - v : 0), v);
      g->lost_after = c ? atoll(c + 1) : 0;
    }
    if (GET("unsupported")) parse_faults(g, GET("unsupported"), 0);
    if (GET("fail")) parse_faults(g, GET("fail"), 1);
  } else if (!strcmp(kind, "mig")) {
    int gi = NUM("gpu", -1), i = NUM("idx", -1);
    if (gi < 0 || gi >= MAX_GPUS || i < 0 || i >= MAX_MIGS) return;
    mig_t *m = &S.migs[gi][i];
    m->present = 1;
    snprintf(m->uuid, sizeof m->uuid, "%s", GET("uuid") ? GET("uuid") : "MIG-0");
    m->gi = NUM("gi", i + 1); m->ci = NUM("ci", 0);
    m->gslices = NUM("gslices", 1); m->cslices = NUM("cslices", m->gslices);
    m->mem_mb = NUM("mem_mb", 9984); m->mem_used = NUM("mem_used", 0);
    m->gpm_util = NUM("gpm_util", 0);
  } else if (!strcmp(kind, "proc") && S.n_procs < MAX_PROCS) {
    proc_t *pr = &S.procs[S.n_procs++];
    pr->gpu = NUM("gpu", 0); pr->mig = NUM("mig", -1); pr->pid = NUM("pid", 1);
    pr->mem = NUM("mem", 0); pr->sm = NUM("sm", 0); pr->memutil = NUM("memutil", 0);
    pr->idle = NUM("idle", 0);
    pr->was = NUM("was", -1);
    pr->was_mem = pr->was > 0 ? pr->memutil : 0;
    pr->since_us = now_us() - NUM("for_ms", 0) * 1000LL;
    const char *ctx = GET("ctx") ? GET("ctx") : "compute";
    pr->ctx = !strcmp(ctx, "graphics") ? CTX_GRAPHICS
              : !strcmp(ctx, "both") ? CTX_COMPUTE | CTX_GRAPHICS : CTX_COMPUTE;
    if (NUM("mps", 0) && (pr->ctx & CTX_COMPUTE)) pr->ctx = (pr->ctx & ~CTX_COMPUTE) | CTX_MPS;
  }
#undef GET
#undef NUM
}

static void load_scenario(void) {
  const char *path = getenv("FAKENVML_SCENARIO");
  if (!path) return;
  struct stat st;
  if (stat(path, &st) != 0) return;
  if (loaded_size >= 0 && (getenv("FAKENVML_STATIC") ||
      (st.st_mtim.tv_sec == loaded_mtime.tv_sec && st.st_mtim.tv_nsec == loaded_mtime.tv_nsec
       && st.st_size == loaded_size)))
    return;
  FILE *f = fopen(path, "r");
  if (!f) return;
  static proc_t before[MAX_PROCS]; int n_before = S.n_procs;
  memcpy(before, S.procs, sizeof(proc_t) * n_before);
  memset(&S, 0, sizeof S);
  snprintf(S.driver, sizeof S.driver, "550.54.15");
  S.count = -1;
  char line[4096];
  while (fgets(line, sizeof line, f)) parse_line(line);
  fclose(f);
  /* A pid whose activity the rewrite changed ran at its old activity until now. */
  for (int i = 0; i < S.n_procs; i++) {
    proc_t *p = &S.procs[i];
    for (int j = 0; j < n_before && p->was < 0; j++) {
      const proc_t *o = &before[j];
      if (o->pid != p->pid || o->gpu != p->gpu) continue;
      unsigned o_sm = o->idle ? 0 : o->sm, o_mem = o->idle ? 0 : o->memutil;
      if (o_sm == (p->idle ? 0 : p->sm) && o_mem == (p->idle ? 0 : p->memutil)) {
        p->was = o->was; p->was_mem = o->was_mem; p->since_us = o->since_us;
      } else {
        p->was = o_sm; p->was_mem = o_mem; p->since_us = now_us();
      }
    }
  }
  if (S.count < 0) {
    S.count = 0;
    for (int i = 0; i < MAX_GPUS; i++) if (S.gpus[i].present) S.count = i + 1;
  }
  loaded_mtime = st.st_mtim; loaded_size = st.st_size;
  if (!loaded_at_us) loaded_at_us = now_us();
}

/* Every entry point starts here: reload the scenario if it changed. */
#define ENTER() pthread_mutex_lock(&lock); load_scenario()
#define RETURN(x) do { nvmlReturn_t _r = (x); pthread_mutex_unlock(&lock); return _r; } while (0)

static int fault(const gpu_t *g, const char *reading) {
  for (int i = 0; i < g->n_faults; i++)
    if (!strcmp(g->faults[i].reading, reading)) return g->faults[i].code;
  return OK;
}

/* Common checks for a device call: initialised, valid handle, lost GPU, injected faults. */
static nvmlReturn_t check(nvmlDevice_t d, const char *reading, gpu_t **g, mig_t **m) {
  if (!initialized) return E_UNINIT;
  if (S.all_error) return S.all_error;
  if (!d || d->gpu < 0 || d->gpu >= MAX_GPUS || !S.gpus[d->gpu].present) return E_INVALID;
  *g = &S.gpus[d->gpu];
  if (m) *m = d->is_mig ? &S.migs[d->gpu][d->mig] : NULL;
  gpu_t *gg = *g;
  if (gg->lost_reading[0] && (!strcmp(gg->lost_reading, "any") ||
                              (reading && !strcmp(gg->lost_reading, reading))) &&
      ++gg->lost_calls >= gg->lost_after)
    gg->lost = 1;  /* fell off the bus just now: this call and every later one */
  if (gg->lost) return E_GPU_LOST;
  if (d->is_mig && !S.migs[d->gpu][d->mig].present) return E_INVALID;
  return reading ? fault(*g, reading) : OK;
}

/* --- lifecycle ------------------------------------------------------------------------ */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
  (void)flags;
  ENTER();
  if (S.init_error) RETURN(S.init_error);
  initialized = 1;
  for (int i = 0; i < MAX_GPUS; i++) {
    gpu_handles[i] = (fake_dev){0, i, -1};
    for (int j = 0; j < MAX_MIGS; j++) mig_handles[i][j] = (fake_dev){1, i, j};
  }
  RETURN(OK);
}
nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) { ENTER(); initialized = 0; RETURN(OK); }

const char *nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case OK: return "Success";
    case E_NOT_SUPPORTED: return "Not Supported";
    case E_GPU_LOST: return "GPU is lost";
    default: return "Fake NVML error";
  }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *buf, unsigned int len) {
  ENTER();
  if (!initialized) RETURN(E_UNINIT);
  snprintf(buf, len, "%s", S.driver);
  RETURN(OK);
}
nvmlReturn_t nvmlSystemGetNVMLVersion(char *buf, unsigned int len) {
  ENTER();
  snprintf(buf, len, "12.%s", S.driver);
  RETURN(OK);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
  ENTER();
  if (!initialized) RETURN(E_UNINIT);
  if (S.all_error) RETURN(S.all_error);
  *count = S.count;
  RETURN(OK);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
  ENTER();
  if (!initialized) RETURN(E_UNINIT);
  if (S.all_error) RETURN(S.all_error);
  if (i >= (unsigned)S.count || i >= MAX_GPUS || !S.gpus[i].present) RETURN(E_INVALID);
  if (S.gpus[i].lost) RETURN(E_GPU_LOST);
  *d = &gpu_handles[i];
  RETURN(OK);
}

/* --- identity ------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *buf, unsigned int len) {
  gpu_t *g; mig_t *m; ENTER();
  nvmlReturn_t r = check(d, NULL, &g, &m);
  if (r) RETURN(r);
  snprintf(buf, len, "%s", m ? m->uuid : g->uuid);
  RETURN(OK);
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *buf, unsigned int len) {
  gpu_t *g; mig_t *m; ENTER();
  nvmlReturn_t r = check(d, NULL, &g, &m);
  if (r) RETURN(r);
  if (m) snprintf(buf, len, "%s MIG %ug.%ugb", g->name, m->gslices, (m->mem_mb + 1023) / 1024);
  else snprintf(buf, len, "%s", g->name);
  RETURN(OK);
}

typedef struct {
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
} nvmlPciInfo_t;

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
  gpu_t *g; ENTER();
  nvmlReturn_t r = check(d, NULL, &g, NULL);
  if (r) RETURN(r);
  memset(pci, 0, sizeof *pci);
  snprintf(pci->busId, sizeof pci->busId, "%s", g->pci);
  snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%.15s", g->pci);
  RETURN(OK);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor) {
  gpu_t *g; ENTER();
  nvmlReturn_t r = check(d, "minor", &g, NULL);
  if (r) RETURN(r);
  *minor = g->minor;
  RETURN(OK);
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
  gpu_t *g; ENTER();
  nvmlReturn_t r = check(d, NULL, &g, NULL);
  if (r) RETURN(r);
  *index = d->gpu;
  RETURN(OK);
}

/* --- MIG ------------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pending) {
  gpu_t *g; ENTER();
  nvmlReturn_t r = check(d, "mig_mode", &g, NULL);
  if (r) RETURN(r);
  *cur = *pending = g->mig ? 1 : 0;
  RETURN(OK);
}
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
  gpu_t *g; ENTER();
  nvmlReturn_t r = check(d, NULL, &g, NULL);
  if (r) RETURN(r);
  *count = g->mig ? MAX_MIGS : 0;
  RETURN(OK);
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int i,
                                                 nvmlDevice_t *out) {
  gpu_t *g; ENTER();
  nvmlReturn_t r = check(d, "mig_handle", &g, NULL);
  if (r) RETURN(r);
  if (d->is_mig || !g->mig) RETURN(E_INVALID);
  if (i >= MAX_MIGS) RETURN(E_INVALID);
  if (!S.migs[d->gpu][i].present) RETURN(E_NOT_FOUND);
  *out = &mig_handles[d->gpu][i];
  RETURN(OK);
}
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig) {
  ENTER();
  *is_mig = d && d->is_mig;
  RETURN(OK);
}
nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *out) {
  gpu_t *g; ENTER();
  nvmlReturn_t r = check(d, NULL, &g, NULL);
  if (r) RETURN(r);
  if (!d->is_mig) RETURN(E_INVALID);
  *out = &gpu_handles[d->gpu];
  RETURN(OK);
}
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
  gpu_t *g; mig_t *m; ENTER();
  nvmlReturn_t r = check(d, NULL, &g, &m);
  if (r) RETURN(r);
  if (!m) RETURN(E_INVALID);
  *id = m->gi;
  RETURN(OK);
}
nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) {
  gpu_t *g; mig_t *m; ENTER();
  nvmlReturn_t r = check(d, NULL, &g, &m);
  if (r) RETURN(r);
  if (!m) RETURN(E_INVALID);
  *id = m->ci;
  RETURN(OK);
}

typedef struct {
  unsigned multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
      sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
  unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t d, nvmlDeviceAttributes_t *a) {
  gpu_t *g; mig_t *m; ENTER();
  nvmlReturn_t r = check(d, NULL, &g, &m);
  if (r) RETURN(r);
  memset(a, 0, sizeof *a);
  a->gpuInstanceSliceCount = m ? m->gslices : 7;
  a->computeInstanceSliceCount = m ? m->cslices : 7;
  a->multiprocessorCount = (m ? m->cslices : 7) * 18;
  a->memorySizeMB = m ? m->mem_mb : g->mem_total / (1024 * 1024);
  RETURN(OK);
}

/* --- utilization ---------------------------------------------------------------------- */

typedef struct { unsigned gpu, memory; } nvmlUtilization_t;

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
  gpu_t *g; ENTER();
  nvmlReturn_t r = check(d, "util_rates", &g, NULL);
  if (r) RETURN(r);
  if (g->mig || d->is_mig) RETURN(E_NOT_SUPPORTED);
  long long k = now_us() / g->sample_us;
  u->gpu = g->util[k % (g->n_util ? g->n_util : 1)];
  u->memory = g->mem_util;
  RETURN(OK);
}

typedef union { double d; unsigned ui; unsigned long ul; unsigned long long ull;
                long long sll; int si; unsigned short us; } nvmlValue_t;
typedef struct { unsigned long long timeStamp; nvmlValue_t sampleValue; } nvmlSample_t;

#ifndef FAKENVML_OLD_DRIVER
/* Samples every sample_us, aligned to the epoch; the buffer holds the last SAMPLE_BUF. */
nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t d, int type, unsigned long long last_seen,
                                  int *value_type, unsigned int *count, nvmlSample_t *out) {
  gpu_t *g; ENTER();
  nvmlReturn_t r = check(d, "samples", &g, NULL);
  if (r) RETURN(r);
  if (g->mig || d->is_mig || type != 1) RETURN(E_NOT_SUPPORTED);
  long long newest = now_us() / g->sample_us;
  long long oldest = newest - SAMPLE_BUF + 1;
  long long first = (long long)(last_seen / g->sample_us) + 1;
  if (first < oldest) first = oldest;
  long long n = newest - first + 1;
  if (n <= 0) RETURN(E_NOT_FOUND);
  *value_type = 1;
  if (!out) { *count = n; RETURN(OK); }
  if (n > *count) n = *count;
  for (long long i = 0; i < n; i++) {
    long long k = first + i;
    out[i].timeStamp = k * g->sample_us;
    out[i].sampleValue.ull = 0;
    out[i].sampleValue.ui = g->util[k % (g->n_util ? g->n_util : 1)];
  }
  *count = n;
  RETURN(OK);
}
#endif

typedef struct { unsigned pid; unsigned long long timeStamp; unsigned smUtil, memUtil, encUtil,
                 decUtil; } nvmlProcessUtilizationSample_t;

/* A process's activity in the sample period that ends at ts. */
static void activity(const proc_t *p, long long ts, unsigned *sm, unsigned *mem) {
  if (p->was >= 0 && ts < p->since_us) { *sm = (unsigned)p->was; *mem = p->was_mem; }
  else if (p->idle) { *sm = *mem = 0; }
  else { *sm = p->sm; *mem = p->memutil; }
}

/* Whether an MPS client is on the GPU (mig < 0: anywhere on it) - then its server runs. */
static int mps_clients(int gpu, int mig) {
  for (int i = 0; i < S.n_procs; i++)
    if (S.procs[i].gpu == gpu && (S.procs[i].ctx & CTX_MPS) && (mig < 0 || S.procs[i].mig == mig))
      return 1;
  return 0;
}

/* At most one entry per process on the device that did work in a period after last_seen:
 * its mean over those periods (PROC_BUF at most), stamped with its newest active period. */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d,
                                             nvmlProcessUtilizationSample_t *out,
                                             unsigned int *count, unsigned long long last_seen) {
  gpu_t *g; ENTER();
  nvmlReturn_t r = check(d, "proc_util", &g, NULL);
  if (r) RETURN(r);
  if (g->mig || d->is_mig) RETURN(E_NOT_SUPPORTED);
  unsigned cap = PROC_BUF;
  for (int i = 0, n = 0; i < S.n_procs; i++)
    if (S.procs[i].gpu == d->gpu && ++n > (int)cap) cap = n;
  if (!out || *count < cap) { *count = cap; RETURN(E_INSUFFICIENT_SIZE); }
  long long newest = now_us() / g->sample_us;
  long long first = (long long)(last_seen / g->sample_us) + 1;
  if (first < newest - PROC_BUF + 1) first = newest - PROC_BUF + 1;
  unsigned n = 0;
  for (int i = 0; i < S.n_procs && first <= newest; i++) {
    const proc_t *p = &S.procs[i];
    if (p->gpu != d->gpu) continue;
    unsigned long long sum_sm = 0, sum_mem = 0; long long active = -1;
    for (long long k = first; k <= newest; k++) {
      unsigned sm, mem;
      activity(p, k * g->sample_us, &sm, &mem);
      sum_sm += sm; sum_mem += mem;
      if (sm || mem) active = k;
    }
    if (active < 0) continue;  /* did no work since last_seen: no entry */
    long long periods = newest - first + 1;
    out[n++] = (nvmlProcessUtilizationSample_t){
        p->pid, (unsigned long long)(active * g->sample_us), (unsigned)(sum_sm / periods),
        (unsigned)(sum_mem / periods), 0, 0};
  }
  if (g->mps_server_sm && mps_clients(d->gpu, -1) && first <= newest && n < *count)
    out[n++] = (nvmlProcessUtilizationSample_t){
        g->mps_server, (unsigned long long)(newest * g->sample_us), g->mps_server_sm, 0, 0, 0};
  if (n == 0) RETURN(E_NOT_FOUND);
  *count = n;
  RETURN(OK);
}

/* --- memory, power, thermals, clocks, energy ----------------------------------------- */

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; }
    nvmlMemory_v2_t;

static void mig_mem(const gpu_t *g, const mig_t *m, unsigned long long *total,
                    unsigned long long *used, unsigned long long *reserved) {
  if (m) { *total = (unsigned long long)m->mem_mb << 20; *used = m->mem_used; *reserved = 0; }
  else { *total = g->mem_total; *used = g->mem_used; *reserved = g->mem_reserved; }
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *mem) {
  gpu_t *g; mig_t *m; ENTER();
  nvmlReturn_t r = check(d, "memory", &g, &m);
  if (r) RETURN(r);
  unsigned long long total, used, reserved;
  mig_mem(g, m, &total, &used, &reserved);
  mem->total = total; mem->used = used + reserved; mem->free = total - used - reserved;
  RETURN(OK);
}

#ifndef FAKENVML_OLD_DRIVER
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *mem) {
  gpu_t *g; mig_t *m; ENTER();
  nvmlReturn_t r = check(d, "memory", &g, &m);
  if (!r) r = fault(g, "memory_v2");  /* e.g. 25: a driver that wants another struct version */
  if (r) RETURN(r);
  if (mem->version != 0x02000028) RETURN(E_ARG_VERSION);
  unsigned long long total, used, reserved;
  mig_mem(g, m, &total, &used, &reserved);
  mem->total = total; mem->used = used; mem->reserved = reserved;
  mem->free = total - used - reserved;
  RETURN(OK);
}
#endif

#define SIMPLE_UINT(fn, reading, field)                                      \
  nvmlReturn_t fn(nvmlDevice_t d, unsigned int *out) {                       \
    gpu_t *g; ENTER();                                                       \
    nvmlReturn_t r = check(d, reading, &g, NULL);                            \
    if (r) RETURN(r);                                                        \
    if (d->is_mig) RETURN(E_NOT_SUPPORTED);                                  \
    *out = g->field;                                                         \
    RETURN(OK);                                                              \
  }
SIMPLE_UINT(nvmlDeviceGetPowerUsage, "power", power_mw)
SIMPLE_UINT(nvmlDeviceGetEnforcedPowerLimit, "limit", limit_mw)

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *out) {
  gpu_t *g; ENTER();
  nvmlReturn_t r = check(d, "temp", &g, NULL);
  if (r) RETURN(r);
  if (sensor != 0 || d->is_mig) RETURN(E_INVALID);
  *out = g->temp;
  RETURN(OK);
}
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *out) {
  gpu_t *g; ENTER();
  nvmlReturn_t r = check(d, "clock", &g, NULL);
  if (r) RETURN(r);
  if (type != 1 || d->is_mig) RETURN(E_INVALID);
  *out = g->sm_clock;
  RETURN(OK);
}
/* Energy grows with the configured power from the moment the scenario was first loaded. */
nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *out) {
  gpu_t *g; ENTER();
  nvmlReturn_t r = check(d, "energy", &g, NULL);
  if (r) RETURN(r);
  *out = g->energy_mj + (unsigned long long)((now_us() - loaded_at_us) / 1000) * g->power_mw
         / 1000;
  RETURN(OK);
}

/* Real NVML blocks ~20 ms here to measure; so does the fake. */
nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *out) {
  gpu_t *g; ENTER();
  nvmlReturn_t r = check(d, "pcie", &g, NULL);
  if (r) RETURN(r);
  pthread_mutex_unlock(&lock);
  usleep(20000);
  pthread_mutex_lock(&lock);
  *out = (unsigned)(g->pcie_kb_s * (counter == 0 ? 1 : 2));
  RETURN(OK);
}

typedef struct {
  unsigned fieldId, scopeId;
  long long timestamp, latencyUsec;
  int valueType;
  nvmlReturn_t nvmlReturn;
  nvmlValue_t value;
} nvmlFieldValue_t;

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int n, nvmlFieldValue_t *values) {
  gpu_t *g; ENTER();
  nvmlReturn_t r = check(d, "fields", &g, NULL);
  if (r) RETURN(r);
  long long now = now_us();
  for (int i = 0; i < n; i++) {
    nvmlFieldValue_t *v = &values[i];
    v->timestamp = now; v->latencyUsec = 0; v->value.ull = 0;
    if ((v->fieldId == 138 || v->fieldId == 139) && g->nvlink_kib_s >= 0 &&
        !fault(g, "nvlink")) {
      v->valueType = 3;
      v->nvmlReturn = OK;
      v->value.ull = (unsigned long long)(g->nvlink_kib_s * (v->fieldId == 138 ? 1 : 2) *
                                          (now - loaded_at_us) / 1000000LL);
    } else {
      v->nvmlReturn = fault(g, "nvlink") ? fault(g, "nvlink") : E_NOT_SUPPORTED;
    }
  }
  RETURN(OK);
}

/* --- processes ------------------------------------------------------------------------ */

typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId,
                 computeInstanceId; } nvmlProcessInfo_t;

#ifndef FAKENVML_OLD_DRIVER
/* The processes with a context of this kind on the device (or MIG instance). */
static nvmlReturn_t running(nvmlDevice_t d, const char *reading, int ctx, unsigned int *count,
                            nvmlProcessInfo_t *out) {
  gpu_t *g; mig_t *m; ENTER();
  nvmlReturn_t r = check(d, reading, &g, &m);
  if (r) RETURN(r);
  /* The compute listing shows the MPS server while it has a client on the device. */
  int server = (ctx & CTX_COMPUTE) && mps_clients(d->gpu, m ? d->mig : -1);
  unsigned n = server;
  for (int i = 0; i < S.n_procs; i++)
    if (S.procs[i].gpu == d->gpu && (S.procs[i].ctx & ctx) && (!m || S.procs[i].mig == d->mig))
      n++;
  if (!out || *count < n) { *count = n; RETURN(n ? E_INSUFFICIENT_SIZE : OK); }
  unsigned j = 0;
  if (server)
    out[j++] = (nvmlProcessInfo_t){g->mps_server, 32ULL << 20,
                                   m ? m->gi : 0xFFFFFFFF, m ? m->ci : 0xFFFFFFFF};
  for (int i = 0; i < S.n_procs; i++) {
    proc_t *p = &S.procs[i];
    if (p->gpu != d->gpu || !(p->ctx & ctx) || (m && p->mig != d->mig)) continue;
    unsigned gi = 0xFFFFFFFF, ci = 0xFFFFFFFF;
    if (p->mig >= 0) { gi = S.migs[p->gpu][p->mig].gi; ci = S.migs[p->gpu][p->mig].ci; }
    out[j++] = (nvmlProcessInfo_t){p->pid, p->mem, gi, ci};
  }
  *count = n;
  RETURN(OK);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                     nvmlProcessInfo_t *out) {
  return running(d, "processes", CTX_COMPUTE, count, out);
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                      nvmlProcessInfo_t *out) {
  return running(d, "graphics", CTX_GRAPHICS, count, out);
}
/* nvidia-ml-py's nvmlDeviceGetMPSComputeRunningProcesses calls _v3 only; _v2 (the same
 * struct) is here for a caller that asks for it by name. */
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count,
                                                        nvmlProcessInfo_t *out) {
  return running(d, "mps", CTX_MPS, count, out);
}
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *count,
                                                        nvmlProcessInfo_t *out) {
  return running(d, "mps", CTX_MPS, count, out);
}
#endif

/* --- XID events ----------------------------------------------------------------------- */

typedef struct { int dummy; } event_set_t;
static event_set_t the_set;
typedef struct { nvmlDevice_t device; unsigned long long eventType, eventData;
                 unsigned gpuInstanceId, computeInstanceId; } nvmlEventData_t;

nvmlReturn_t nvmlEventSetCreate(event_set_t **set) {
  ENTER();
  if (!initialized) RETURN(E_UNINIT);
  *set = &the_set;
  RETURN(OK);
}
nvmlReturn_t nvmlEventSetFree(event_set_t *set) { (void)set; ENTER(); RETURN(OK); }
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types,
                                      event_set_t *set) {
  gpu_t *g; ENTER();
  (void)types; (void)set;
  RETURN(check(d, "events", &g, NULL));
}
nvmlReturn_t nvmlEventSetWait_v2(event_set_t *set, nvmlEventData_t *data, unsigned int ms) {
  (void)set; (void)ms;
  ENTER();
  if (!initialized) RETURN(E_UNINIT);
  for (int i = 0; i < MAX_GPUS; i++) {
    gpu_t *g = &S.gpus[i];
    if (g->present && xid_delivered[i] < g->xid_count) {
      xid_delivered[i]++;
      *data = (nvmlEventData_t){&gpu_handles[i], 0x8, (unsigned long long)g->xid_code,
                                0xFFFFFFFF, 0xFFFFFFFF};
      RETURN(OK);
    }
  }
  RETURN(E_TIMEOUT);
}

/* --- GPM (Hopper+): per-MIG-instance utilization -------------------------------------- */

#ifndef FAKENVML_OLD_DRIVER
typedef struct { int gpu; unsigned gi; long long ts; } gpm_sample_t;
typedef struct { unsigned version, isSupportedDevice; } nvmlGpmSupport_t;
typedef struct { char *shortName, *longName, *unit; } metric_info_t;
typedef struct { unsigned metricId; nvmlReturn_t nvmlReturn; double value; metric_info_t info; }
    nvmlGpmMetric_t;
typedef struct { unsigned version, numMetrics; gpm_sample_t *sample1, *sample2;
                 nvmlGpmMetric_t metrics[477]; } nvmlGpmMetricsGet_t;

nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t d, nvmlGpmSupport_t *s) {
  gpu_t *g; ENTER();
  nvmlReturn_t r = check(d, NULL, &g, NULL);
  if (r) RETURN(r);
  s->isSupportedDevice = g->gpm ? 1 : 0;
  RETURN(OK);
}
nvmlReturn_t nvmlGpmSampleAlloc(gpm_sample_t **s) {
  *s = calloc(1, sizeof **s);
  return *s ? OK : 20;
}
nvmlReturn_t nvmlGpmSampleFree(gpm_sample_t *s) { free(s); return OK; }
nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t d, unsigned gi, gpm_sample_t *s) {
  gpu_t *g; ENTER();
  nvmlReturn_t r = check(d, NULL, &g, NULL);
  if (r) RETURN(r);
  if (!g->gpm) RETURN(E_NOT_SUPPORTED);
  s->gpu = d->gpu; s->gi = gi; s->ts = now_us();
  RETURN(OK);
}
nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *req) {
  ENTER();
  if (!initialized) RETURN(E_UNINIT);
  if (req->version != 1 || !req->sample1 || !req->sample2) RETURN(E_INVALID);
  gpm_sample_t *a = req->sample1, *b = req->sample2;
  if (a->gpu != b->gpu || a->gi != b->gi || b->ts < a->ts) RETURN(E_INVALID);
  if (S.gpus[a->gpu].lost) RETURN(E_GPU_LOST);
  unsigned util = 0; int found = 0;
  for (int j = 0; j < MAX_MIGS; j++)
    if (S.migs[a->gpu][j].present && S.migs[a->gpu][j].gi == a->gi) {
      util = S.migs[a->gpu][j].gpm_util; found = 1;
    }
  for (unsigned i = 0; i < req->numMetrics && i < 477; i++) {
    nvmlGpmMetric_t *m = &req->metrics[i];
    m->nvmlReturn = found && (m->metricId == 1 || m->metricId == 2) ? OK : E_NOT_SUPPORTED;
    m->value = util;
  }
  RETURN(OK);
}
#endif
