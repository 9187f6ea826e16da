/* engine_impl.h: the checkpoint engine's state, shared by its parts. Internal.
 *   engine.c       the life cycle: options, the background thread, new, free, wait
 *   engine_plan.c  which rank writes which box (cached per layout), shared with load
 *   engine_save.c  retention and rewinding, staging, and the background write and
 *                  commit of a save (run_job)
 *   engine_load.c  load: read what is needed once, send it to the ranks that need it */
#ifndef TSR_ENGINE_IMPL_H
#define TSR_ENGINE_IMPL_H

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "archive.h"
#include "common.h"
#include "encoder.h"
#include "manifest.h"
#include "pool.h"
#include "store.h"

#define TAG_MOD 32000
#define MSG_LEN 1024
/* The commit exchange on the background comm: reports to rank 0, its verdict back. */
#define TAG_REPORT 1
#define TAG_VERDICT 2
#define VERDICT_BROKEN 1u /* flag: a rank missed the exchange; its message may come later */

typedef struct staged {
    uint32_t tensor;
    tsr_box box;
    size_t off; /* in the arena, TSR_ALIGN-aligned: raw frames are written from there */
} staged;

typedef struct staged_blob {
    char name[TSR_MAX_NAME + 1];
    int32_t rank;
    size_t off, size;
} staged_blob;

typedef struct job {
    char dir[PATH_MAX];
    uint64_t step;
    uint8_t save_id[16];
    tsr_layout layout;
    tsr_tensor_decl *tensors; /* names copied into names */
    size_t n_tensors;
    char *names;
    staged *boxes;
    size_t n_boxes;
    staged_blob *blobs;
    size_t n_blobs;
    uint64_t staged_bytes; /* raw bytes of the boxes and blobs */
} job;

struct tsr_engine {
    char root[PATH_MAX];
    tsr_comm *comm, *bg;
    uint32_t rank, size;
    tsr_engine_opts opts;
    uint8_t engine_id[16];
    uint64_t n_saves;
    /* plan cache */
    uint64_t plan_key;
    int have_plan;
    size_t *mine;   /* state box index of each box this rank writes */
    size_t n_mine;
    tsr_encoder *enc; /* the background save's threads and buffers, kept across saves */
    /* staging */
    uint8_t *arena;
    size_t arena_cap;
    /* background */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending, busy, stop;
    job job;
    int last_status;
    tsr_error last_err;
    int broken; /* a commit exchange timed out: e->bg may hold a late message */
    double last_wait, last_stall;
    tsr_archiver *arch; /* rank 0, when archiving */
    char archive_url[PATH_MAX];
    tsr_folder_lock *lock; /* rank 0, with opts.lock_root */
    int rewind_pending;    /* the next save moves the steps after continue_from aside */
    uint64_t continue_from;
};


/* Every rank's boxes, from an allgather: held[r] (n_held[r]) into one array. */
typedef struct all_boxes {
    tsr_rank_box *v;
    const tsr_rank_box **held;
    size_t *n_held;
} all_boxes;

/* engine.c */
void engine_job_clear(job *j);
/* engine_save.c: the background save: write this rank's file, the commit exchange */
void engine_run_job(tsr_engine *e);
/* engine_plan.c */
void engine_all_boxes_free(all_boxes *a);
int engine_gather_boxes(tsr_comm *c, const tsr_state *st, all_boxes *out, tsr_error *err);
long engine_plan_find(const tsr_save_plan *p, uint32_t tensor, const tsr_box *box);
int engine_check_state(const tsr_state *st, tsr_error *err);
size_t *engine_elem_sizes(const tsr_state *st);
int engine_plan_save(tsr_engine *e, const tsr_state *st, tsr_error *err);

#endif
