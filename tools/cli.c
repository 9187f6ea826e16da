/* cli.c: helpers shared by the subcommands. */
#include "cli.h"

#include <cblas.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "heartbeat.h"
#include "load_fault.h"
#include "s3.h"
#include "store.h"
#include "tessera.h"

const char *tsr_fmt_bytes(uint64_t n, char *buf, size_t len) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 5) v /= 1024, u++;
    if (u == 0) snprintf(buf, len, "%llu B", (unsigned long long)n);
    else snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}

int tsr_opt(int argc, char **argv, int *i, const char *name, int takes_value, const char **val) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, "--", 2) != 0 || strncmp(a + 2, name, n) != 0) return 0;
    const char *rest = a + 2 + n;
    if (!takes_value) {
        if (*rest) return 0;
        *val = NULL;
        return 1;
    }
    if (*rest == '=') {
        *val = rest + 1;
        return 1;
    }
    if (*rest) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "tessera: option --%s needs a value\n", name);
        return -1;
    }
    *val = argv[++*i];
    return 1;
}

int tsr_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tessera %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see 'tessera %s --help')\n", cmd);
    va_end(ap);
    return EXIT_USAGE;
}

void tsr_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

static void progress_draw(tsr_progress *p, int final) {
    double t = tsr_now() - p->start;
    double frac = p->total ? (double)p->done / (double)p->total : 1.0;
    if (frac > 1) frac = 1;
    int width = 30, fill = (int)(frac * width);
    char bar[64], a[32], b[32];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = 0;
    double rate = t > 0 ? (double)p->done / t : 0;
    fprintf(stderr, "\r%-10s [%s] %5.1f%% %s / %s  %.0f MB/s%s", p->label, bar, frac * 100,
            tsr_fmt_bytes(p->done, a, sizeof a), tsr_fmt_bytes(p->total, b, sizeof b), rate / 1e6,
            final ? "\n" : "");
    fflush(stderr);
}

int tsr_parse_codec(const char *s, int *out) {
    static const struct { const char *name; int codec; } codecs[] = {
        {"auto", TSR_CODEC_AUTO}, {"raw", TSR_CODEC_RAW}, {"zstd", TSR_CODEC_ZSTD}, {"bytegroup", TSR_CODEC_BYTEGROUP}};
    for (size_t i = 0; i < sizeof codecs / sizeof *codecs; i++)
        if (strcmp(s, codecs[i].name) == 0) {
            *out = codecs[i].codec;
            return 0;
        }
    return -1;
}

void tsr_progress_start(tsr_progress *p, const char *label, uint64_t total) {
    *p = (tsr_progress){label, total, 0, tsr_now(), 0, isatty(2)};
}

void tsr_progress_add(tsr_progress *p, uint64_t n) {
    p->done += n;
    if (!p->active) return;
    double t = tsr_now();
    if (t - p->last_draw < 0.1) return;
    p->last_draw = t;
    progress_draw(p, 0);
}

void tsr_progress_end(tsr_progress *p) {
    if (p->active) progress_draw(p, 1);
    p->active = 0;
}

void tsr_resolve_ckpt_dir(const char *cmd, const char *dir, char *out, size_t len) {
    uint64_t step;
    snprintf(out, len, "%s", dir);
    if (tsr_ckpt_is_committed(dir)) return;
    if (tsr_latest_step(dir, &step, out, len) == 0)
        fprintf(stderr, "tessera %s: using the newest checkpoint under %s: %s\n", cmd, dir, out);
    else
        snprintf(out, len, "%s", dir);
}

tsr_comm *tsr_cli_comm(const char *cmd) {
    int under_mpirun = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_RANK");
    if (!under_mpirun) return tsr_comm_self();
    tsr_error e = {0};
    tsr_comm *c = tsr_comm_mpi_world(&e);
    if (!c) fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
    return c;
}

static void upload_progress(void *user, uint64_t n) { tsr_progress_add(user, n); }

/* names in order, config.json last (it tells readers that a model is there) */
static int upload_order(const void *a, const void *b) {
    int ca = strcmp(a, "config.json") == 0, cb = strcmp(b, "config.json") == 0;
    return ca != cb ? ca - cb : strcmp(a, b);
}

int tsr_upload_dir(const char *local, const char *url, const char *cmd) {
    tsr_error e = {0};
    char bucket[TSR_S3_MAX_BUCKET], key[TSR_S3_MAX_KEY];
    struct stat st;
    if (stat(local, &st) != 0) {
        fprintf(stderr, "tessera %s: %s: %s\n", cmd, local, strerror(errno));
        return -1;
    }
    tsr_s3 *s3 = tsr_s3_split(url, bucket, sizeof bucket, key, sizeof key, &e) ? NULL : tsr_s3_new(NULL, &e);
    if (!s3) {
        fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
        return -1;
    }
    size_t kl = strlen(key);
    while (kl && key[kl - 1] == '/') key[--kl] = 0;
    DIR *d = S_ISDIR(st.st_mode) ? opendir(local) : NULL;
    tsr_progress bar;
    tsr_progress_start(&bar, cmd, 0);
    tsr_s3_transfer t = {upload_progress, &bar, 0, 0, 0};
    int rc = 0;
    if (!S_ISDIR(st.st_mode)) {
        rc = tsr_s3_upload_file(s3, local, bucket, key, &t, &e);
    } else if (!d) {
        rc = tsr_err(&e, TSR_EIO, "%s: %s", local, strerror(errno));
    } else {
        /* in name order with config.json last; after a failure the objects this
         * call uploaded are deleted again, so that no partial set stays */
        char (*names)[256] = NULL;
        size_t n = 0, cap = 0, done = 0;
        struct dirent *ent;
        while (!rc && (ent = readdir(d))) {
            char path[PATH_MAX + 300];
            snprintf(path, sizeof path, "%s/%s", local, ent->d_name);
            if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || strlen(ent->d_name) >= sizeof *names) continue;
            if (tsr_grow((void **)&names, &cap, n, sizeof *names)) rc = tsr_err(&e, TSR_ENOMEM, "out of memory");
            else snprintf(names[n++], sizeof *names, "%s", ent->d_name);
        }
        closedir(d);
        tsr_sort(names, n, sizeof *names, upload_order);
        char path[PATH_MAX + 300], k[TSR_S3_MAX_KEY + 300];
        for (; !rc && done < n; done++) {
            snprintf(path, sizeof path, "%s/%s", local, names[done]);
            snprintf(k, sizeof k, "%s%s%s", key, kl ? "/" : "", names[done]);
            rc = tsr_s3_upload_file(s3, path, bucket, k, &t, &e);
        }
        for (size_t i = 0; rc && i < done; i++) {
            snprintf(k, sizeof k, "%s%s%s", key, kl ? "/" : "", names[i]);
            tsr_error de = {0};
            if (tsr_s3_delete(s3, bucket, k, &de))
                fprintf(stderr, "tessera %s: could not delete s3://%s/%s after the failure: %s\n", cmd, bucket, k, de.msg);
        }
        free(names);
    }
    tsr_progress_end(&bar);
    tsr_s3_free(s3);
    if (rc) fprintf(stderr, "tessera %s: %s\n", cmd, e.msg);
    return rc ? -1 : 0;
}

void tsr_cli_set_threads(void) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    long local = ls ? atol(ls) : 1;
    long n = cores / (local > 0 ? local : 1);
    if (n < 1) n = 1;
    if (!getenv("OMP_NUM_THREADS")) omp_set_num_threads((int)n);
    if (!getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads((int)n);
}

int tsr_cli_faults(void) {
    const char *nan = getenv("TSR_FAULT_NAN");
    uint64_t n;
    if (nan && *nan) {
        if (tsr_parse_u64(nan, &n) || n < 1) {
            fprintf(stderr, "tessera: TSR_FAULT_NAN: %s: not a step number (1 or more)\n", nan);
            return -1;
        }
        tsr_heartbeat_set_fault_nan(n);
    }
    const char *slow = getenv("TSR_FAULT_SLOW");
    if (slow && *slow) {
        int rank, ms, used = 0;
        if (sscanf(slow, "%d:%d%n", &rank, &ms, &used) != 2 || slow[used] || rank < 0 || ms < 1 || ms > 600000) {
            fprintf(stderr, "tessera: TSR_FAULT_SLOW: %s: not RANK:MS (a rank, milliseconds 1..600000)\n", slow);
            return -1;
        }
        tsr_heartbeat_set_fault_slow(rank, ms);
    }
    const char *load = getenv("TSR_FAULT_LOAD");
    if (load && *load) {
        int kind = !strcmp(load, "shift") ? ENGINE_FAULT_SHIFT : !strcmp(load, "swap") ? ENGINE_FAULT_SWAP
                 : !strcmp(load, "bcast") ? ENGINE_FAULT_BCAST : !strcmp(load, "send") ? ENGINE_FAULT_SEND
                 : !strcmp(load, "decode") ? ENGINE_FAULT_DECODE : 0;
        if (!kind) {
            fprintf(stderr, "tessera: TSR_FAULT_LOAD: %s: not shift, swap, bcast, send or decode\n", load);
            return -1;
        }
        engine_set_fault_load(kind);
    }
    const char *spec = getenv("TSR_FAULT");
    tsr_error e = {0};
    if (!spec || !*spec || tsr_fault_set(spec, &e) == 0) return 0;
    fprintf(stderr, "tessera: TSR_FAULT: %s\n", e.msg);
    return -1;
}
