/* cli.h: what every subcommand of the tessera command shares: option parsing,
 * sizes, JSON output and the progress bar. */
#ifndef TSR_CLI_H
#define TSR_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "common.h" /* tsr_now, tsr_parse_size, tsr_parse_u64 */
#include "tessera.h"

/* Exit statuses of every command. */
enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

/* tsr_parse_codec(): "auto", "raw", "zstd", "bytegroup" into *out (TSR_CODEC_*).
 * @return 0, or -1 for another name. */
int tsr_parse_codec(const char *s, int *out);

/* tsr_fmt_bytes(): "1.50 GiB" into buf. */
const char *tsr_fmt_bytes(uint64_t n, char *buf, size_t len);

/* Option parsing: for each argv[i] starting with "--", tsr_opt() matches
 * "--name" and takes its value from "--name=V" or the next argument.
 * @return 1 and *val (NULL for a flag) when argv[*i] is that option, 0 otherwise;
 * a missing value is reported on stderr and returns -1. */
int tsr_opt(int argc, char **argv, int *i, const char *name, int takes_value, const char **val);

/* Prints "tessera CMD: MSG" on stderr and returns EXIT_USAGE. */
int tsr_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* JSON: a string with escapes. */
void tsr_json_str(FILE *f, const char *s);

/* The one progress bar: drawn on stderr only when it is a terminal. */
typedef struct tsr_progress {
    const char *label;
    uint64_t total, done;
    double start, last_draw;
    int active;
} tsr_progress;
void tsr_progress_start(tsr_progress *p, const char *label, uint64_t total);
void tsr_progress_add(tsr_progress *p, uint64_t n);
void tsr_progress_end(tsr_progress *p);


/* tsr_resolve_ckpt_dir(): `dir` itself when it holds a MANIFEST; else, when it is
 * a root of step directories, its newest committed one (said on stderr); else
 * `dir` (opening it then reports the problem). */
void tsr_resolve_ckpt_dir(const char *cmd, const char *dir, char *out, size_t len);


/* tsr_upload_dir(): uploads the regular file `local` to the object url, or each
 * regular file in the directory `local` to url/NAME (in name order, config.json
 * last; after a failure the objects it uploaded are deleted again), with the S3
 * client (a progress bar on a terminal). @return 0, or -1 after printing
 * "tessera CMD: why". */
int tsr_upload_dir(const char *local, const char *url, const char *cmd);

/* tsr_cli_comm(): MPI_COMM_WORLD when the process was started by mpirun, else a
 * group of one (no MPI). NULL on failure, with the reason on stderr. */
struct tsr_comm *tsr_cli_comm(const char *cmd);

/* tsr_cli_set_threads(): OpenMP's and OpenBLAS's thread counts (unless
 * OMP_NUM_THREADS / OPENBLAS_NUM_THREADS say otherwise): the node's cores shared
 * among the ranks mpirun placed on it, so that oversubscribed ranks do not
 * fight over cores. The trainer's setting, and bench gemm's. */
void tsr_cli_set_threads(void);

/* tsr_cli_faults(): storage fault injection for the command's tests: the spec
 * in the environment variable TSR_FAULT (store/store.h describes it) set for the
 * whole process (tsr_fault_set), the trainer's NaN at step TSR_FAULT_NAN
 * (tsr_heartbeat_set_fault_nan) and its straggler, rank RANK working MS
 * milliseconds longer each step, from TSR_FAULT_SLOW=RANK:MS
 * (tsr_heartbeat_set_fault_slow), and a layout-conversion bug planted in every
 * load, TSR_FAULT_LOAD=shift|swap|bcast (engine_set_fault_load, load_fault.h).
 * The one place that reads them. @return 0 (also
 * when unset), or -1 for a value that does not parse, after printing
 * "tessera: TSR_FAULT: why". */
int tsr_cli_faults(void);

#endif
