/* engine_impl.h: the checkpoint engine's state, shared by its parts. Internal.
 *   engine.c       the life cycle: options, the background thread, new, free, wait,
 *                  and a save's steps in order; it calls down into the others
 *   engine_plan.c  which rank writes which box (cached per layout), shared with load
 *   engine_save.c  a save's phases: plan (agreement, room, the cached plan), stage,
 *                  and in the background the write and the commit exchange
 *   engine_load.c  a load's phases: plan, read (what is needed, once), send, agree
 * The engine reads checkpoints through the reader's calls (tsr_ckpt_*): it knows
 * boxes and chunks, not the format's frames. */
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
#include "load_fault.h"
#include "pool.h"
#include "store.h"
#include "tsr_ckpt.h"

/* Room for an error message that travels between ranks. */
#define MSG_LEN 1024

typedef struct staged {
    uint32_t tensor;
    tsr_box box;
    size_t off;      /* in the arena, TSR_ALIGN-aligned: raw frames are written from there */
    tsr_stats stats; /* its statistics, taken by the staging copy ... */
    int stats_taken; /* ... when every piece's copy took them (tsr_stats_copy) */
} staged;

typedef struct staged_blob {
    char name[TSR_MAX_NAME + 1];
    int32_t rank;
    size_t off, size;
} staged_blob;

typedef struct save_job { /* the save in flight: what was staged for it */
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
    struct stage_copy *deferred; /* overlap_staging: the boxes' copy, for the background */
    int agree_later;             /* the ranks' agreement on this save is the background's first step */
} save_job;

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
    tsr_mem_kind arena_for; /* the device kind the arena was pinned for (tried once); 0: none */
    int arena_pinned;       /* 1: that pinning took */
    double pin_seconds;     /* tsr_engine_pin_seconds */
    /* background */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending, busy, stop;
    int staging;        /* overlap_staging: the job's copy of the boxes not done yet */
    save_job job;
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

/* engine_save.c: the phases of a save, called by engine.c in this order. */
/* engine_save_plan(): the ranks agree (engine_agree) that every state is valid,
 * that every engine can save (*broken: this engine cannot, since an earlier
 * commit exchange timed out; set when another rank reports it) and whether the
 * cached save plan still holds; rank 0 makes room (retention, rewinding) first.
 * When this rank's state has the layout of the cached plan, nothing is
 * exchanged here: *later is set and the background agrees before it writes, so
 * that the save call waits for no other rank. Otherwise the agreement (and a new
 * plan when the layout changed on every rank) is made here, collective on e->bg
 * (the background is idle) and e->comm. */
int engine_save_plan(tsr_engine *e, uint64_t step, const tsr_state *st, int *broken, int *later, tsr_error *err);
/* engine_stage(): copies this rank's boxes and blobs into the arena and fills
 * e->job for a save of `step` into `dir`. The background thread must be idle. */
int engine_stage(tsr_engine *e, const char *dir, uint64_t step, const tsr_state *st, tsr_error *err);
/* engine_run_job(): in the background thread: writes this rank's data file, then
 * the commit exchange with its deadline. @return the save's status (err says
 * why); *broken when the exchange may have left a late message on e->bg. */
int engine_run_job(tsr_engine *e, tsr_error *err, int *broken);
/* engine_retention(): removes the committed steps past keep_latest (not one still
 * waiting to be archived) and uncommitted leftovers; rank 0. */
void engine_retention(tsr_engine *e, int before_save);
/* engine_arena_reserve(): the staging arena holds at least `need` bytes
 * (mapped, touched and, where allowed, locked). */
int engine_arena_reserve(tsr_engine *e, size_t need, tsr_error *err);
/* engine_arena_pin(): the arena pinned for the device kind of st's first
 * device box (nothing for host state, or when pinned for that kind already). */
void engine_arena_pin(tsr_engine *e, const tsr_state *st);
void engine_job_clear(save_job *j);

/* engine_plan.c */
void engine_all_boxes_free(all_boxes *a);
int engine_gather_boxes(tsr_comm *c, const tsr_state *st, all_boxes *out, tsr_error *err);
long engine_plan_find(const tsr_save_plan *p, uint32_t tensor, const tsr_box *box);
int engine_check_state(const tsr_state *st, tsr_error *err);
size_t *engine_elem_sizes(const tsr_state *st);
int engine_plan_save(tsr_engine *e, const tsr_state *st, tsr_error *err);
uint64_t engine_state_key(const tsr_state *st);
/* engine_agree(): every rank's code (AGREE_*) compared on e->bg; the lowest
 * decides. @return 0 when the cached plans hold everywhere, AGREE_REPLAN when
 * every rank must plan again now, or an error: a state invalid (here: here_rc
 * with err as the check left it), an engine broken (*broken set), or a layout
 * that changed on some ranks only (the cache dropped everywhere; the next save
 * plans again). */
enum { AGREE_INVALID = 0, AGREE_BROKEN = 1, AGREE_REPLAN = 2, AGREE_CACHED = 3 };
int engine_agree(tsr_engine *e, uint64_t step, int64_t code, int here_rc, int *broken, tsr_error *err);

#endif
