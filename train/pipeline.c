/* pipeline.c: the pipeline schedules (GPipe and 1F1B) that run a step's
 * micro-batches through this rank's stage (by the forward and backward passes
 * trainer.c hands them), and the activations and their gradients sent between
 * stages. */
#include "trainer_impl.h"

#include "common.h"

/* Micro-batch j's messages: tag 2 j + TAG_FWD its activations, 2 j + TAG_BWD
 * their gradients. */
enum { TAG_FWD = 0, TAG_BWD = 1 };

int tsr_pipeline_recv_fwd(tsr_trainer *t, int j, float *x, tsr_error *err) {
    return tsr_plane_recv(&t->plane, t->world, t->prev, 2 * j + TAG_FWD, TSR_F32, x, t->N * (size_t)t->args.dim, err);
}

int tsr_pipeline_send_fwd(tsr_trainer *t, int j, const float *x, tsr_error *err) {
    return tsr_plane_send(&t->plane, t->world, t->next, 2 * j + TAG_FWD, TSR_F32, x, t->N * (size_t)t->args.dim, t->reqs,
                          err);
}

int tsr_pipeline_recv_bwd(tsr_trainer *t, int j, float *dx, tsr_error *err) {
    return tsr_plane_recv(&t->plane, t->world, t->next, 2 * j + TAG_BWD, TSR_F32, dx, t->N * (size_t)t->args.dim, err);
}

int tsr_pipeline_send_bwd(tsr_trainer *t, int j, const float *dx, tsr_error *err) {
    size_t NC = t->N * (size_t)t->args.dim;
    float *send = t->dsend + (size_t)j * NC; /* unchanged until the step's sends complete */
    tsr_kc_copy(&t->kc, send, dx, NC * sizeof(float));
    return tsr_plane_send(&t->plane, t->world, t->prev, 2 * j + TAG_BWD, TSR_F32, send, NC, t->reqs, err);
}

/* The micro-batches through the stage: GPipe (all forwards, then all backwards)
 * or 1F1B (warm-up forwards, then one forward and one backward in turn, then the
 * remaining backwards). Sends are nonblocking and receives blocking, so neither
 * schedule can deadlock. */
int tsr_pipeline_run(tsr_trainer *t, tsr_mb_pass fwd, tsr_mb_pass bwd, tsr_error *err) {
    int M = t->M, rc = 0;
    if (t->layout.pp == 1) {
        for (int j = 0; j < M && !rc; j++) {
            rc = fwd(t, j, err);
            if (!rc) rc = bwd(t, j, err);
        }
        return rc;
    }
    int warm = M;
    if (t->cfg.parallelism.pipeline_parallel_schedule == TSR_SCHED_1F1B) {
        warm = (int)(t->layout.pp - t->co.pp - 1);
        if (warm > M) warm = M;
    }
    int f = 0, b = 0;
    for (; f < warm && !rc; f++) rc = fwd(t, f, err);
    while (f < M && !rc) {
        rc = fwd(t, f++, err);
        if (!rc) rc = bwd(t, b++, err);
    }
    while (b < M && !rc) rc = bwd(t, b++, err);
    int rc2 = tsr_plane_wait(&t->plane, t->world, t->reqs, rc ? NULL : err);
    return rc ? rc : rc2;
}
