/*
 * A stand-in for NVIDIA's libnvidia-ml.so.1, for testing sysscope on machines without a GPU.
 *
 * It exports the entry points sysscope calls through nvml-wrapper 0.13, with the real
 * NVML ABI: the same symbol names (versioned ones such as nvmlInit_v2, nvmlDeviceGetCount_v2,
 * nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetComputeRunningProcesses_v3,
 * nvmlDeviceGetMemoryInfo_v2, nvmlEventSetWait_v2), the same struct layouts and return codes
 * (nvml.h of CUDA 12), and the same calling conventions (count queries answer
 * NVML_ERROR_INSUFFICIENT_SIZE, versioned structs are checked, a handle of a device that is
 * gone answers NVML_ERROR_GPU_IS_LOST). The exporter loads it through `gpu.nvml_library` like
 * the real library, so everything from dlopen to the exposition runs for real.
 *
 * What it reports comes from a state file (its path in the environment variable
 * SYSSCOPE_NVML_STANDIN_STATE), read again whenever it changes; tests rewrite it atomically
 * (write a temporary file, rename it over). One setting a line, `#` starts a comment:
 *
 *   driver_version 550.54.15          nvmlSystemGetDriverVersion
 *   cuda_version 12040                nvmlSystemGetCudaDriverVersion(_v2)
 *   sample_period_ms 100              period of the per-process utilisation samples
 *   call_log PATH                     append one line per call (name, device, arguments)
 *   fail FUNCTION CODE                FUNCTION answers CODE (global, or for the current device)
 *   unprivileged                      the caller lacks NVML's admin privileges: the process
 *                                     lists of a GPU in MIG mode (its parent handle) answer
 *                                     NVML_ERROR_NO_PERMISSION, as NVML answers such callers
 *   device                            starts a device (NVML index = order in the file)
 *     uuid GPU-...                    required
 *     name NVIDIA A100-SXM4-80GB      rest of the line
 *     serial 1320221234567
 *     pci_bus_id 00000000:3B:00.0
 *     error CODE                      every call on the device answers CODE
 *     utilization GPU MEM             percent (nvmlDeviceGetUtilizationRates)
 *     memory USED TOTAL               bytes (free = TOTAL - USED)
 *     power_mw MW
 *     temperature C
 *     clocks GRAPHICS SM MEM          MHz
 *     energy_mj MJ                    nvmlDeviceGetTotalEnergyConsumption
 *     clocks_event_reasons MASK       nvmlDeviceGetCurrentClocks{Event,Throttle}Reasons (0x.. ok)
 *     ecc CV UV CA UA                 corrected/uncorrected, volatile then aggregate
 *     process PID USED SM MEM [GI CI] a compute context: USED bytes (- for unavailable); a
 *                                     process with SM or MEM > 0 has a utilisation sample in
 *                                     every sample period; GI/CI on a MIG instance
 *     graphics_process PID USED       a graphics context
 *     insufficient_size FUNCTION N    the next N calls of FUNCTION (nvmlDeviceGetProcessUtilization
 *                                     or nvmlDeviceGet{Compute,Graphics}RunningProcesses_v3) with a
 *                                     buffer answer NVML_ERROR_INSUFFICIENT_SIZE asking for one more
 *                                     entry than given, as when processes start between a count
 *                                     query and the call that fills the buffer
 *     mig CURRENT PENDING             MIG mode (absent: MIG not supported)
 *     mig_device                      starts a MIG device of the current device
 *       uuid MIG-...  name ...  memory USED TOTAL  gpu_instance N  compute_instance N
 *     xid ID CODE                     an XID critical error, delivered once to every event
 *                                     set the device was registered in before it appeared
 *                                     (IDs increase); a set with a device that is gone or lost
 *                                     answers NVML_ERROR_GPU_IS_LOST to every wait
 *
 * Whatever it does not recognise makes every call answer NVML_ERROR_UNKNOWN and is printed
 * on stderr, so a mistyped test state cannot pass silently. Like the real library in MIG
 * mode (nvml.h: "On MIG-enabled GPUs, querying device utilization rates is not currently
 * supported"), a GPU whose MIG mode is on answers NVML_ERROR_NOT_SUPPORTED to device and
 * per-process utilisation whatever its `utilization` line says, and MIG devices answer it to
 * utilisation, power, clocks and the rest.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

/* nvml.h structs, field for field. */
typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

struct handle;
typedef struct handle *nvmlDevice_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

struct event_set;
typedef struct event_set *nvmlEventSet_t;

#define NVML_VALUE_NOT_AVAILABLE (~0ULL)
#define NO_INSTANCE 0xFFFFFFFFu
#define EVENT_XID 0x8ULL
#define MAX_MIG 7

/* ---- state ---------------------------------------------------------------------------- */

#define MAX_DEVICES 16
#define MAX_PROCS 64
#define MAX_FAILS 32
#define MAX_XIDS 256
#define MAX_HANDLES 256
#define TEXT 96

struct fail {
    char function[64];
    int code;
};

struct proc {
    unsigned int pid;
    unsigned long long used;
    int sm, mem;
    unsigned int gi, ci;
    int graphics;
};

struct mig_device {
    char uuid[TEXT], name[TEXT];
    int has_memory;
    unsigned long long used, total;
    unsigned int gi, ci;
};

struct xid {
    unsigned long long id, code;
};

struct device {
    char uuid[TEXT], name[TEXT], serial[TEXT], pci_bus_id[TEXT];
    int error;
    int has_util, util_gpu, util_mem;
    int has_memory;
    unsigned long long used, total;
    int has_power, power_mw;
    int has_temp, temp;
    int has_clocks, clock_graphics, clock_sm, clock_mem;
    int has_energy;
    unsigned long long energy_mj;
    int has_reasons;
    unsigned long long reasons;
    int has_ecc;
    unsigned long long ecc[4];
    struct proc procs[MAX_PROCS];
    int nprocs;
    int has_mig, mig_current, mig_pending;
    struct mig_device migs[MAX_MIG];
    int nmigs;
    struct xid xids[MAX_XIDS];
    int nxids;
    struct fail fails[MAX_FAILS];
    int nfails;
    /* Calls still to answer INSUFFICIENT_SIZE, by function (`code` counts down). */
    struct fail short_buffers[MAX_FAILS];
    int nshort_buffers;
};

struct state {
    char driver_version[TEXT];
    int cuda_version;
    unsigned long long sample_period_us;
    char call_log[512];
    struct fail fails[MAX_FAILS];
    int nfails;
    int unprivileged;
    struct device devices[MAX_DEVICES];
    int ndevices;
    /* Set when the file could not be read or parsed: every call answers NVML_ERROR_UNKNOWN. */
    int broken;
};

/* A handle names a device by UUID, so it stays valid while the device is listed and answers
 * GPU_IS_LOST once it is not, whatever the indices do meanwhile. */
struct handle {
    char uuid[TEXT];
    char parent[TEXT]; /* a MIG device's parent; empty for a GPU */
};

struct event_set {
    char uuids[MAX_DEVICES][TEXT];
    int n;
    /* The newest XID id of each registered device when it was registered or last delivered. */
    unsigned long long seen[MAX_DEVICES];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct state st;
static struct stat loaded;
static int have_loaded;
static int initialised;
static struct handle handles[MAX_HANDLES];
static int nhandles;

static void set_defaults(struct state *s) {
    memset(s, 0, sizeof(*s));
    snprintf(s->driver_version, sizeof(s->driver_version), "550.54.15");
    s->cuda_version = 12040;
    s->sample_period_us = 100000;
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t')
        s++;
    char *end = s + strlen(s);
    while (end > s && (end[-1] == '\n' || end[-1] == '\r' || end[-1] == ' ' || end[-1] == '\t'))
        *--end = 0;
    return s;
}

static int parse_u64(const char *text, unsigned long long *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 0);
    if (errno || end == text || *end)
        return -1;
    *out = v;
    return 0;
}

/* Splits `rest` into at most `max` words; returns how many. */
static int words(char *rest, char **out, int max) {
    int n = 0;
    char *save;
    for (char *w = strtok_r(rest, " \t", &save); w && n < max; w = strtok_r(NULL, " \t", &save))
        out[n++] = w;
    return n;
}

static int numbers(char *rest, unsigned long long *out, int want_min, int want_max) {
    char *w[8];
    int n = words(rest, w, 8);
    if (n < want_min || n > want_max)
        return -1;
    for (int i = 0; i < n; i++)
        if (parse_u64(w[i], &out[i]))
            return -1;
    return n;
}

static int parse_file(const char *path, struct state *s) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "nvml stand-in: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    set_defaults(s);
    struct device *dev = NULL;
    struct mig_device *mig = NULL;
    char line[1024];
    int lineno = 0, bad = 0;
    while (fgets(line, sizeof(line), f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = 0;
        char *l = trim(line);
        if (!*l)
            continue;
        char *key = l, *rest = l + strcspn(l, " \t");
        if (*rest)
            *rest++ = 0;
        rest = trim(rest);
        unsigned long long v[8];
        int ok = 1;
#define COPY(dst) snprintf((dst), sizeof(dst), "%s", rest)
        if (!strcmp(key, "device")) {
            if (s->ndevices == MAX_DEVICES) {
                ok = 0;
            } else {
                dev = &s->devices[s->ndevices++];
                mig = NULL;
            }
        } else if (!strcmp(key, "mig_device")) {
            if (!dev || dev->nmigs == MAX_MIG)
                ok = 0;
            else {
                mig = &dev->migs[dev->nmigs++];
                mig->gi = mig->ci = NO_INSTANCE;
            }
        } else if (!strcmp(key, "driver_version") && !dev) {
            COPY(s->driver_version);
        } else if (!strcmp(key, "cuda_version") && !dev) {
            ok = numbers(rest, v, 1, 1) == 1;
            s->cuda_version = (int)v[0];
        } else if (!strcmp(key, "sample_period_ms") && !dev) {
            ok = numbers(rest, v, 1, 1) == 1 && v[0] > 0;
            s->sample_period_us = v[0] * 1000;
        } else if (!strcmp(key, "unprivileged") && !dev && !*rest) {
            s->unprivileged = 1;
        } else if (!strcmp(key, "call_log") && !dev) {
            COPY(s->call_log);
        } else if (!strcmp(key, "fail")) {
            char *w[2];
            struct fail *list = dev ? dev->fails : s->fails;
            int *n = dev ? &dev->nfails : &s->nfails;
            ok = words(rest, w, 2) == 2 && *n < MAX_FAILS && !parse_u64(w[1], &v[0]);
            if (ok) {
                snprintf(list[*n].function, sizeof(list[*n].function), "%s", w[0]);
                list[(*n)++].code = (int)v[0];
            }
        } else if (mig && !strcmp(key, "uuid")) {
            COPY(mig->uuid);
        } else if (mig && !strcmp(key, "name")) {
            COPY(mig->name);
        } else if (mig && !strcmp(key, "memory")) {
            ok = numbers(rest, v, 2, 2) == 2;
            mig->has_memory = 1, mig->used = v[0], mig->total = v[1];
        } else if (mig && !strcmp(key, "gpu_instance")) {
            ok = numbers(rest, v, 1, 1) == 1;
            mig->gi = (unsigned int)v[0];
        } else if (mig && !strcmp(key, "compute_instance")) {
            ok = numbers(rest, v, 1, 1) == 1;
            mig->ci = (unsigned int)v[0];
        } else if (!dev) {
            ok = 0;
        } else if (!strcmp(key, "uuid")) {
            COPY(dev->uuid);
        } else if (!strcmp(key, "name")) {
            COPY(dev->name);
        } else if (!strcmp(key, "serial")) {
            COPY(dev->serial);
        } else if (!strcmp(key, "pci_bus_id")) {
            COPY(dev->pci_bus_id);
        } else if (!strcmp(key, "error")) {
            ok = numbers(rest, v, 1, 1) == 1;
            dev->error = (int)v[0];
        } else if (!strcmp(key, "utilization")) {
            ok = numbers(rest, v, 2, 2) == 2 && v[0] <= 100 && v[1] <= 100;
            dev->has_util = 1, dev->util_gpu = (int)v[0], dev->util_mem = (int)v[1];
        } else if (!strcmp(key, "memory")) {
            ok = numbers(rest, v, 2, 2) == 2 && v[0] <= v[1];
            dev->has_memory = 1, dev->used = v[0], dev->total = v[1];
        } else if (!strcmp(key, "power_mw")) {
            ok = numbers(rest, v, 1, 1) == 1;
            dev->has_power = 1, dev->power_mw = (int)v[0];
        } else if (!strcmp(key, "temperature")) {
            ok = numbers(rest, v, 1, 1) == 1;
            dev->has_temp = 1, dev->temp = (int)v[0];
        } else if (!strcmp(key, "clocks")) {
            ok = numbers(rest, v, 3, 3) == 3;
            dev->has_clocks = 1;
            dev->clock_graphics = (int)v[0], dev->clock_sm = (int)v[1], dev->clock_mem = (int)v[2];
        } else if (!strcmp(key, "energy_mj")) {
            ok = numbers(rest, v, 1, 1) == 1;
            dev->has_energy = 1, dev->energy_mj = v[0];
        } else if (!strcmp(key, "clocks_event_reasons")) {
            ok = numbers(rest, v, 1, 1) == 1;
            dev->has_reasons = 1, dev->reasons = v[0];
        } else if (!strcmp(key, "ecc")) {
            ok = numbers(rest, v, 4, 4) == 4;
            dev->has_ecc = 1;
            memcpy(dev->ecc, v, sizeof(dev->ecc));
        } else if (!strcmp(key, "process") || !strcmp(key, "graphics_process")) {
            char *w[6];
            int n = words(rest, w, 6);
            int graphics = key[0] == 'g';
            ok = dev->nprocs < MAX_PROCS && (graphics ? n == 2 : (n == 4 || n == 6));
            if (ok) {
                struct proc *p = &dev->procs[dev->nprocs++];
                memset(p, 0, sizeof(*p));
                p->graphics = graphics;
                p->gi = p->ci = NO_INSTANCE;
                ok = !parse_u64(w[0], &v[0]);
                p->pid = (unsigned int)v[0];
                if (!strcmp(w[1], "-"))
                    p->used = NVML_VALUE_NOT_AVAILABLE;
                else
                    ok = ok && !parse_u64(w[1], &p->used);
                for (int i = 2; ok && i < n; i++)
                    ok = !parse_u64(w[i], &v[i]);
                if (ok && !graphics) {
                    ok = v[2] <= 100 && v[3] <= 100;
                    p->sm = (int)v[2], p->mem = (int)v[3];
                    if (n == 6)
                        p->gi = (unsigned int)v[4], p->ci = (unsigned int)v[5];
                }
            }
        } else if (!strcmp(key, "insufficient_size")) {
            char *w[2];
            ok = words(rest, w, 2) == 2 && dev->nshort_buffers < MAX_FAILS &&
                 !parse_u64(w[1], &v[0]);
            if (ok) {
                struct fail *f = &dev->short_buffers[dev->nshort_buffers++];
                snprintf(f->function, sizeof(f->function), "%s", w[0]);
                f->code = (int)v[0];
            }
        } else if (!strcmp(key, "mig")) {
            ok = numbers(rest, v, 2, 2) == 2;
            dev->has_mig = 1, dev->mig_current = (int)v[0], dev->mig_pending = (int)v[1];
        } else if (!strcmp(key, "xid")) {
            ok = numbers(rest, v, 2, 2) == 2 && dev->nxids < MAX_XIDS;
            if (ok) {
                dev->xids[dev->nxids].id = v[0];
                dev->xids[dev->nxids++].code = v[1];
            }
        } else {
            ok = 0;
        }
#undef COPY
        if (!ok) {
            fprintf(stderr, "nvml stand-in: %s:%d: cannot use `%s %s`\n", path, lineno, key, rest);
            bad = 1;
        }
    }
    fclose(f);
    for (int i = 0; i < s->ndevices; i++) {
        if (!s->devices[i].uuid[0]) {
            fprintf(stderr, "nvml stand-in: %s: device %d has no uuid\n", path, i);
            bad = 1;
        }
    }
    return bad ? -1 : 0;
}

/* Reads the state file again if it changed. Called with `lock` held. */
static void refresh(void) {
    const char *path = getenv("SYSSCOPE_NVML_STANDIN_STATE");
    struct stat now;
    if (!path || stat(path, &now)) {
        if (!st.broken)
            fprintf(stderr, "nvml stand-in: SYSSCOPE_NVML_STANDIN_STATE (%s) cannot be read\n",
                    path ? path : "unset");
        set_defaults(&st);
        st.broken = 1;
        have_loaded = 0;
        return;
    }
    if (have_loaded && now.st_ino == loaded.st_ino && now.st_size == loaded.st_size &&
        now.st_mtim.tv_sec == loaded.st_mtim.tv_sec &&
        now.st_mtim.tv_nsec == loaded.st_mtim.tv_nsec)
        return;
    static struct state next;
    if (parse_file(path, &next)) {
        set_defaults(&st);
        st.broken = 1;
    } else {
        st = next;
    }
    loaded = now;
    have_loaded = 1;
}

static void log_call(const char *fmt, ...) {
    if (!st.call_log[0])
        return;
    FILE *f = fopen(st.call_log, "a");
    if (!f)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

static int failing(const struct fail *list, int n, const char *function) {
    for (int i = 0; i < n; i++)
        if (!strcmp(list[i].function, function))
            return list[i].code;
    return 0;
}

/* Whether this call of `function` with a buffer is one that finds it too small
 * (`insufficient_size`): counts the call down. */
static int short_buffer(struct device *d, const char *function) {
    for (int i = 0; i < d->nshort_buffers; i++) {
        if (!strcmp(d->short_buffers[i].function, function) && d->short_buffers[i].code > 0) {
            d->short_buffers[i].code--;
            return 1;
        }
    }
    return 0;
}

/* Every entry point starts here: lock, refresh, and the checks every call shares. */
static nvmlReturn_t enter(const char *function) {
    pthread_mutex_lock(&lock);
    refresh();
    if (st.broken)
        return NVML_ERROR_UNKNOWN;
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    int code = failing(st.fails, st.nfails, function);
    return code ? code : NVML_SUCCESS;
}

static nvmlReturn_t leave(nvmlReturn_t r) {
    pthread_mutex_unlock(&lock);
    return r;
}

static struct device *find_device(const char *uuid) {
    for (int i = 0; i < st.ndevices; i++)
        if (!strcmp(st.devices[i].uuid, uuid))
            return &st.devices[i];
    return NULL;
}

static struct handle *handle_for(const char *uuid, const char *parent) {
    for (int i = 0; i < nhandles; i++)
        if (!strcmp(handles[i].uuid, uuid))
            return &handles[i];
    if (nhandles == MAX_HANDLES)
        return NULL;
    struct handle *h = &handles[nhandles++];
    snprintf(h->uuid, sizeof(h->uuid), "%s", uuid);
    snprintf(h->parent, sizeof(h->parent), "%s", parent ? parent : "");
    return h;
}

static int valid_handle(nvmlDevice_t h) {
    return h >= handles && h < handles + nhandles;
}

/* The device (and, for a MIG handle, the MIG device) a handle names now, or the error to
 * answer: a handle of a device no longer listed is lost, as on a GPU that fell off the bus. */
static nvmlReturn_t resolve(nvmlDevice_t h, const char *function, struct device **dev,
                            struct mig_device **mig) {
    if (!valid_handle(h))
        return NVML_ERROR_INVALID_ARGUMENT;
    *mig = NULL;
    *dev = find_device(h->parent[0] ? h->parent : h->uuid);
    if (!*dev)
        return NVML_ERROR_GPU_IS_LOST;
    if ((*dev)->error)
        return (*dev)->error;
    int code = failing((*dev)->fails, (*dev)->nfails, function);
    if (code)
        return code;
    if (h->parent[0]) {
        for (int i = 0; i < (*dev)->nmigs; i++)
            if (!strcmp((*dev)->migs[i].uuid, h->uuid))
                *mig = &(*dev)->migs[i];
        if (!*mig || !(*dev)->mig_current)
            return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

/* Entry on a device: a GPU handle only (`mig_ok` = 0) or a MIG handle too. */
#define DEVICE_CALL(name, h, mig_ok)                                                          \
    struct device *dev;                                                                       \
    struct mig_device *mig;                                                                   \
    nvmlReturn_t r_ = enter(name);                                                            \
    if (r_)                                                                                   \
        return leave(r_);                                                                     \
    r_ = resolve((h), name, &dev, &mig);                                                      \
    if (r_)                                                                                   \
        return leave(r_);                                                                     \
    if (mig && !(mig_ok))                                                                     \
        return leave(NVML_ERROR_NOT_SUPPORTED);                                               \
    (void)mig

static nvmlReturn_t copy_text(char *out, unsigned int length, const char *text) {
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

/* ---- initialisation and system ---------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlInit_v2(void) {
    pthread_mutex_lock(&lock);
    refresh();
    nvmlReturn_t r = st.broken ? NVML_ERROR_UNKNOWN : failing(st.fails, st.nfails, "nvmlInit_v2");
    if (!r)
        initialised++;
    log_call("nvmlInit_v2 -> %d", r);
    return leave(r);
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return nvmlInit_v2();
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t r = initialised ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (initialised)
        initialised--;
    log_call("nvmlShutdown -> %d", r);
    return leave(r);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t r = enter("nvmlSystemGetDriverVersion");
    if (!r)
        r = copy_text(version, length, st.driver_version);
    return leave(r);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    nvmlReturn_t r = enter("nvmlSystemGetNVMLVersion");
    if (!r) {
        char text[TEXT + 8];
        snprintf(text, sizeof(text), "12.%s", st.driver_version);
        r = copy_text(version, length, text);
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    nvmlReturn_t r = enter("nvmlSystemGetCudaDriverVersion_v2");
    if (!r && !version)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (!r)
        *version = st.cuda_version;
    return leave(r);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    return nvmlSystemGetCudaDriverVersion_v2(version);
}

/* ---- enumeration ------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    nvmlReturn_t r = enter("nvmlDeviceGetCount_v2");
    if (!r && !count)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (!r)
        *count = (unsigned int)st.ndevices;
    log_call("nvmlDeviceGetCount_v2 -> %d", r);
    return leave(r);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t r = enter("nvmlDeviceGetHandleByIndex_v2");
    if (r)
        return leave(r);
    if (!device || index >= (unsigned int)st.ndevices)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    struct device *d = &st.devices[index];
    if (d->error)
        return leave(d->error);
    r = failing(d->fails, d->nfails, "nvmlDeviceGetHandleByIndex_v2");
    if (r)
        return leave(r);
    *device = handle_for(d->uuid, NULL);
    return leave(*device ? NVML_SUCCESS : NVML_ERROR_UNKNOWN);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    nvmlReturn_t r = enter("nvmlDeviceGetHandleByUUID");
    if (r)
        return leave(r);
    if (!uuid || !device)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    struct device *d = find_device(uuid);
    if (!d)
        return leave(NVML_ERROR_NOT_FOUND);
    if (d->error)
        return leave(d->error);
    *device = handle_for(d->uuid, NULL);
    return leave(*device ? NVML_SUCCESS : NVML_ERROR_UNKNOWN);
}

/* ---- identity ----------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *uuid, unsigned int length) {
    DEVICE_CALL("nvmlDeviceGetUUID", h, 1);
    return leave(copy_text(uuid, length, mig ? mig->uuid : dev->uuid));
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *name, unsigned int length) {
    DEVICE_CALL("nvmlDeviceGetName", h, 1);
    const char *text = mig ? mig->name : dev->name;
    if (!*text)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    return leave(copy_text(name, length, text));
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t h, char *serial, unsigned int length) {
    DEVICE_CALL("nvmlDeviceGetSerial", h, 0);
    if (!dev->serial[0])
        return leave(NVML_ERROR_NOT_SUPPORTED);
    return leave(copy_text(serial, length, dev->serial));
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t h, nvmlPciInfo_t *pci) {
    DEVICE_CALL("nvmlDeviceGetPciInfo_v3", h, 0);
    if (!pci)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!dev->pci_bus_id[0])
        return leave(NVML_ERROR_NOT_SUPPORTED);
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busId, sizeof(pci->busId), "%.31s", dev->pci_bus_id);
    unsigned int domain = 0, bus = 0, device = 0;
    sscanf(dev->pci_bus_id, "%x:%x:%x", &domain, &bus, &device);
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04x:%02x:%02x.0", domain & 0xffff,
             bus, device);
    pci->domain = domain, pci->bus = bus, pci->device = device;
    pci->pciDeviceId = 0x20b010de;
    pci->pciSubSystemId = 0x134f10de;
    return leave(NVML_SUCCESS);
}

/* ---- gauges ------------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u) {
    DEVICE_CALL("nvmlDeviceGetUtilizationRates", h, 0);
    if (!u)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!dev->has_util || (dev->has_mig && dev->mig_current))
        return leave(NVML_ERROR_NOT_SUPPORTED);
    u->gpu = (unsigned int)dev->util_gpu;
    u->memory = (unsigned int)dev->util_mem;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m) {
    DEVICE_CALL("nvmlDeviceGetMemoryInfo_v2", h, 1);
    if (!m)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (m->version != nvmlMemory_v2)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    int has = mig ? mig->has_memory : dev->has_memory;
    if (!has)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    m->used = mig ? mig->used : dev->used;
    m->total = mig ? mig->total : dev->total;
    m->reserved = 0;
    m->free = m->total - m->used;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t h, unsigned int *mw) {
    DEVICE_CALL("nvmlDeviceGetPowerUsage", h, 0);
    if (!mw)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!dev->has_power)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *mw = (unsigned int)dev->power_mw;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t h, int sensor, unsigned int *c) {
    DEVICE_CALL("nvmlDeviceGetTemperature", h, 0);
    if (!c || sensor != 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!dev->has_temp)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *c = (unsigned int)dev->temp;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t h, int type, unsigned int *mhz) {
    DEVICE_CALL("nvmlDeviceGetClockInfo", h, 0);
    if (!mhz || type < 0 || type > 3)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!dev->has_clocks || type == 3)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *mhz = (unsigned int)(type == 0 ? dev->clock_graphics : type == 1 ? dev->clock_sm
                                                                      : dev->clock_mem);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t h, unsigned long long *mj) {
    DEVICE_CALL("nvmlDeviceGetTotalEnergyConsumption", h, 0);
    if (!mj)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!dev->has_energy)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *mj = dev->energy_mj;
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t reasons(nvmlDevice_t h, const char *name, unsigned long long *mask) {
    DEVICE_CALL(name, h, 0);
    if (!mask)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!dev->has_reasons)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *mask = dev->reasons;
    return leave(NVML_SUCCESS);
}

/* Built with -DSTANDIN_BEFORE_12_2: a driver older than NVML 12.2 (R535), which has only the
 * former name. */
#ifndef STANDIN_BEFORE_12_2
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t h,
                                                           unsigned long long *mask) {
    return reasons(h, "nvmlDeviceGetCurrentClocksEventReasons", mask);
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t h,
                                                              unsigned long long *mask) {
    return reasons(h, "nvmlDeviceGetCurrentClocksThrottleReasons", mask);
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t h, int error_type,
                                                int counter_type, unsigned long long *count) {
    DEVICE_CALL("nvmlDeviceGetTotalEccErrors", h, 0);
    if (!count || error_type < 0 || error_type > 1 || counter_type < 0 || counter_type > 1)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!dev->has_ecc)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *count = dev->ecc[counter_type * 2 + error_type];
    return leave(NVML_SUCCESS);
}

/* ---- processes ---------------------------------------------------------------------------- */

static nvmlReturn_t running(nvmlDevice_t h, const char *name, int graphics, unsigned int *count,
                            nvmlProcessInfo_t *infos) {
    DEVICE_CALL(name, h, 0);
    if (!count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (st.unprivileged && dev->has_mig && dev->mig_current) {
        log_call("%s %s -> no permission", name, dev->uuid);
        return leave(NVML_ERROR_NO_PERMISSION);
    }
    unsigned int n = 0;
    for (int i = 0; i < dev->nprocs; i++)
        n += dev->procs[i].graphics == graphics;
    log_call("%s %s count=%u -> %u", name, dev->uuid, *count, n);
    if (infos && short_buffer(dev, name)) {
        *count += 1;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if (!infos || *count < n) {
        *count = n;
        return leave(n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS);
    }
    unsigned int k = 0;
    for (int i = 0; i < dev->nprocs; i++) {
        struct proc *p = &dev->procs[i];
        if (p->graphics != graphics)
            continue;
        infos[k].pid = p->pid;
        infos[k].usedGpuMemory = p->used;
        infos[k].gpuInstanceId = p->gi;
        infos[k].computeInstanceId = p->ci;
        k++;
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *count,
                                                            nvmlProcessInfo_t *infos) {
    return running(h, "nvmlDeviceGetComputeRunningProcesses_v3", 0, count, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t h, unsigned int *count,
                                                             nvmlProcessInfo_t *infos) {
    return running(h, "nvmlDeviceGetGraphicsRunningProcesses_v3", 1, count, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t h,
                                                               unsigned int *count,
                                                               nvmlProcessInfo_t *infos) {
    DEVICE_CALL("nvmlDeviceGetMPSComputeRunningProcesses_v3", h, 0);
    (void)infos;
    if (!count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *count = 0;
    return leave(NVML_SUCCESS);
}

/* Samples the driver took after `since` (µs of CLOCK_REALTIME): every process with SM or
 * memory activity has one sample per period, stamped with the period's start; the newest
 * period is returned, as the driver keeps only its latest sample per process. */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t h,
                                                    nvmlProcessUtilizationSample_t *samples,
                                                    unsigned int *count,
                                                    unsigned long long since) {
    DEVICE_CALL("nvmlDeviceGetProcessUtilization", h, 0);
    if (!count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (dev->has_mig && dev->mig_current)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long now = (unsigned long long)ts.tv_sec * 1000000ULL + ts.tv_nsec / 1000;
    unsigned long long stamp = now - now % st.sample_period_us;
    unsigned int n = 0;
    for (int i = 0; i < dev->nprocs; i++) {
        struct proc *p = &dev->procs[i];
        n += !p->graphics && (p->sm || p->mem) && stamp > since;
    }
    if (samples)
        log_call("nvmlDeviceGetProcessUtilization %s since=%llu count=%u -> %u", dev->uuid, since,
                 *count, n);
    if (!n)
        return leave(NVML_ERROR_NOT_FOUND);
    if (samples && short_buffer(dev, "nvmlDeviceGetProcessUtilization")) {
        *count += 1;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if (!samples || *count < n) {
        *count = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    unsigned int k = 0;
    for (int i = 0; i < dev->nprocs; i++) {
        struct proc *p = &dev->procs[i];
        if (p->graphics || !(p->sm || p->mem))
            continue;
        samples[k].pid = p->pid;
        samples[k].timeStamp = stamp;
        samples[k].smUtil = (unsigned int)p->sm;
        samples[k].memUtil = (unsigned int)p->mem;
        samples[k].encUtil = 0;
        samples[k].decUtil = 0;
        k++;
    }
    *count = n;
    return leave(NVML_SUCCESS);
}

/* ---- MIG ---------------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t h, unsigned int *current,
                                         unsigned int *pending) {
    DEVICE_CALL("nvmlDeviceGetMigMode", h, 0);
    if (!current || !pending)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!dev->has_mig)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *current = (unsigned int)dev->mig_current;
    *pending = (unsigned int)dev->mig_pending;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t h, unsigned int *count) {
    DEVICE_CALL("nvmlDeviceGetMaxMigDeviceCount", h, 0);
    if (!count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!dev->has_mig)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *count = MAX_MIG;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t h, unsigned int index,
                                                        nvmlDevice_t *out) {
    DEVICE_CALL("nvmlDeviceGetMigDeviceHandleByIndex", h, 0);
    if (!out || index >= MAX_MIG)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!dev->has_mig)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    if (!dev->mig_current || index >= (unsigned int)dev->nmigs)
        return leave(NVML_ERROR_NOT_FOUND);
    *out = handle_for(dev->migs[index].uuid, dev->uuid);
    return leave(*out ? NVML_SUCCESS : NVML_ERROR_UNKNOWN);
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t h, unsigned int *is_mig) {
    DEVICE_CALL("nvmlDeviceIsMigDeviceHandle", h, 1);
    if (!is_mig)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *is_mig = mig != NULL;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t h,
                                                                 nvmlDevice_t *parent) {
    DEVICE_CALL("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", h, 1);
    if (!parent)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!mig)
        return leave(NVML_ERROR_NOT_FOUND);
    *parent = handle_for(dev->uuid, NULL);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t h, unsigned int *id) {
    DEVICE_CALL("nvmlDeviceGetGpuInstanceId", h, 1);
    if (!id)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!mig || mig->gi == NO_INSTANCE)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *id = mig->gi;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t h, unsigned int *id) {
    DEVICE_CALL("nvmlDeviceGetComputeInstanceId", h, 1);
    if (!id)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!mig || mig->ci == NO_INSTANCE)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *id = mig->ci;
    return leave(NVML_SUCCESS);
}

/* ---- events ------------------------------------------------------------------------------- */

static unsigned long long newest_xid(const struct device *d) {
    unsigned long long newest = 0;
    for (int i = 0; i < d->nxids; i++)
        if (d->xids[i].id > newest)
            newest = d->xids[i].id;
    return newest;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    nvmlReturn_t r = enter("nvmlEventSetCreate");
    if (!r && !set)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (!r) {
        *set = calloc(1, sizeof(**set));
        if (!*set)
            r = NVML_ERROR_UNKNOWN;
    }
    return leave(r);
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    pthread_mutex_lock(&lock);
    free(set);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t h, unsigned long long *types) {
    DEVICE_CALL("nvmlDeviceGetSupportedEventTypes", h, 0);
    if (!types)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *types = EVENT_XID;
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t h, unsigned long long types,
                                             nvmlEventSet_t set) {
    DEVICE_CALL("nvmlDeviceRegisterEvents", h, 0);
    if (!set || !types)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (types & ~EVENT_XID)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    for (int i = 0; i < set->n; i++)
        if (!strcmp(set->uuids[i], dev->uuid))
            return leave(NVML_SUCCESS);
    if (set->n == MAX_DEVICES)
        return leave(NVML_ERROR_UNKNOWN);
    snprintf(set->uuids[set->n], TEXT, "%s", dev->uuid);
    set->seen[set->n++] = newest_xid(dev);
    log_call("nvmlDeviceRegisterEvents %s", dev->uuid);
    return leave(NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                        unsigned int timeout_ms) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        nvmlReturn_t r = enter("nvmlEventSetWait_v2");
        if (r)
            return leave(r);
        if (!set || !data)
            return leave(NVML_ERROR_INVALID_ARGUMENT);
        /* A set with a device that is gone (no longer listed, or lost) cannot be waited on. */
        for (int i = 0; i < set->n; i++) {
            struct device *d = find_device(set->uuids[i]);
            if (!d || d->error == NVML_ERROR_GPU_IS_LOST) {
                log_call("nvmlEventSetWait_v2 %s -> lost", set->uuids[i]);
                return leave(NVML_ERROR_GPU_IS_LOST);
            }
        }
        for (int i = 0; i < set->n; i++) {
            struct device *d = find_device(set->uuids[i]);
            /* The oldest XID not yet delivered to this set. */
            struct xid *next = NULL;
            for (int k = 0; k < d->nxids; k++)
                if (d->xids[k].id > set->seen[i] && (!next || d->xids[k].id < next->id))
                    next = &d->xids[k];
            if (next) {
                set->seen[i] = next->id;
                data->device = handle_for(d->uuid, NULL);
                data->eventType = EVENT_XID;
                data->eventData = next->code;
                data->gpuInstanceId = NO_INSTANCE;
                data->computeInstanceId = NO_INSTANCE;
                log_call("nvmlEventSetWait_v2 %s xid=%llu", d->uuid, next->code);
                return leave(NVML_SUCCESS);
            }
        }
        pthread_mutex_unlock(&lock);
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long waited = (now.tv_sec - start.tv_sec) * 1000LL +
                           (now.tv_nsec - start.tv_nsec) / 1000000LL;
        if (waited >= (long long)timeout_ms)
            return NVML_ERROR_TIMEOUT;
        usleep(10000);
    }
}
