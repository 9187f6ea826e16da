/* checkpoint.c: the training job's checkpoints: the state a save holds (the
 * rank's boxes and the blobs: step, data position, config, model shapes, seed,
 * scheduler), the engine with the job's options, the durable tier's saves
 * every checkpoint.interval steps and the local tier's snapshots every
 * checkpoint.local_interval, resume from the newer of the two tiers (or
 * checkpoint.load_step, or checkpoint.initial_load_path), the model-only
 * checkpoint at the end. The loop that calls them is train_loop.c. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "fence.h"
#include "job.h"

static const char *const BLOB_NAMES[N_BLOBS] = {"train.step",  "train.data_pos", "train.config",
                                                "train.model", "train.rng",      "train.lr_scheduler"};

/* ------------------------------------------------------------------ state */

/* The state of this rank: model (and unless model_only, optimizer) boxes. */
static int state_boxes(train_job *j, int model_only, tsr_error *err) {
    tsr_trainer *t = j->t;
    size_t n = t->decls.n_params;
    free(j->boxes);
    j->boxes = calloc(3 * n, sizeof *j->boxes);
    if (!j->boxes) return tsr_err(err, TSR_ENOMEM, "out of memory");
    j->n_boxes = 0;
    for (int k = 0; k < (model_only ? 1 : 3); k++)
        for (size_t p = 0; p < n; p++) {
            param *q = &t->par[p];
            if (!q->on_stage || !q->shard_n) continue;
            j->boxes[j->n_boxes++] = (tsr_state_box){(uint32_t)(k * n + p), q->box, k == 0 ? q->w : k == 1 ? q->m : q->v, t->kc.mem};
        }
    return 0;
}

static tsr_state make_state(train_job *j, int model_only) {
    tsr_trainer *t = j->t;
    tsr_state st = {t->decls.decls, (model_only ? 1 : 3) * t->decls.n_params, j->boxes, j->n_boxes,
                    j->blobs, j->blobs[0].name ? N_BLOBS : 0, t->layout};
    return st;
}

static void fill_blobs(train_job *j, int step, const tsr_data_pos *pos) {
    tsr_st64(j->step_le, (uint64_t)step);
    tsr_data_pos_encode(pos, j->pos_bytes);
    tsr_st64(j->rng_le, (uint64_t)j->t->cfg.training.seed);
    /* next_lr: the schedule's rate for step + 1, so that a PyTorch optimizer
     * loading the state (tessera.dcp's Reader) takes its next step as this job would */
    snprintf(j->sched_text, sizeof j->sched_text, "last_step=%d last_lr=%.9g opt_origin=%d lr_origin=%d next_lr=%.9g",
             step, (double)j->t->last_lr, j->t->opt_origin, j->t->lr_origin,
             tsr_config_lr_at(&j->t->cfg, step + 1 - j->t->lr_origin));
    const void *data[N_BLOBS] = {j->step_le, j->pos_bytes, j->config_text, j->model_text, j->rng_le, j->sched_text};
    size_t size[N_BLOBS] = {8, TSR_DATA_POS_BYTES, strlen(j->config_text), strlen(j->model_text), 8,
                            strlen(j->sched_text)};
    for (int i = 0; i < N_BLOBS; i++) j->blobs[i] = (tsr_state_blob){BLOB_NAMES[i], -1, data[i], size[i]};
}

/* The whole training state as a save of `step` sees it: boxes and blobs. */
static int step_state(train_job *j, int step, tsr_state *st, tsr_error *err) {
    fill_blobs(j, step, &j->pos);
    int rc = state_boxes(j, 0, err);
    *st = make_state(j, 0);
    return rc;
}

/* Reads global blob `i` of ck into a malloc'd NUL-terminated buffer. */
static int read_blob(tsr_ckpt *ck, int i, char **out, size_t *size, tsr_error *err) {
    long b = tsr_ckpt_find_blob(ck, BLOB_NAMES[i], -1);
    if (b < 0) return tsr_err(err, TSR_ENOTFOUND, "%s: no blob %s: not a training checkpoint", tsr_ckpt_dir(ck), BLOB_NAMES[i]);
    tsr_blob_info bi;
    tsr_ckpt_blob(ck, (size_t)b, &bi);
    if (bi.size > (64u << 20)) return tsr_err(err, TSR_ECORRUPT, "%s: blob %s of %llu bytes", tsr_ckpt_dir(ck), BLOB_NAMES[i], (unsigned long long)bi.size);
    char *buf = calloc(1, bi.size + 1);
    if (!buf) return tsr_err(err, TSR_ENOMEM, "out of memory");
    int rc = tsr_ckpt_read_blob(ck, (size_t)b, buf, err);
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    if (size) *size = bi.size;
    return 0;
}

/* ----------------------------------------------------------------- resume */

/* Refuses a checkpoint of another model shape before any tensor is read. A
 * checkpoint without the trainer's train.model blob whose tensors carry the
 * model's names (TorchTitan's, saved by PyTorch through tessera.dcp) is taken as
 * one in PyTorch's layout: *pytorch set, its shapes checked by the load, and
 * *moments set when it holds AdamW's moments under TorchTitan's names. */
static int check_model(train_job *j, const char *dir, int *pytorch, int *moments, tsr_error *err) {
    tsr_ckpt *ck = tsr_ckpt_open(dir, err);
    if (!ck) return err ? err->code : TSR_EIO;
    const char *first = j->t->decls.decls[0].name;
    *pytorch = tsr_ckpt_find_blob(ck, BLOB_NAMES[B_MODEL], -1) < 0 && tsr_ckpt_find(ck, first) >= 0;
    if (*pytorch) {
        char name[600];
        snprintf(name, sizeof name, "optimizer.state.%s.exp_avg", first);
        *moments = tsr_ckpt_find(ck, name) >= 0;
        tsr_ckpt_close(ck);
        return 0;
    }
    char *text = NULL;
    int rc = read_blob(ck, B_MODEL, &text, NULL, err);
    char why[600];
    if (!rc && tsr_model_args_compare(&j->t->args, text, why, sizeof why))
        rc = tsr_err(err, TSR_EINVAL, "a checkpoint of another model: %s", why);
    tsr_model_args saved;
    if (!rc && tsr_model_args_parse(text, &saved, err) == 0 && saved.max_seq_len > j->t->args.max_seq_len) {
        /* a job at a shorter length keeps the context length the model had */
        j->t->args.max_seq_len = saved.max_seq_len;
        tsr_model_args_to_text(&j->t->args, j->model_text, sizeof j->model_text);
    }
    free(text);
    tsr_ckpt_close(ck);
    return rc;
}

/* ------------------------------------------------- a checkpoint of PyTorch */

/* TorchTitan's names of the AdamW moments, flattened as DCP saves them. */
static const char *const TITAN_MOMENT[2] = {"exp_avg", "exp_avg_sq"};

/* The declarations of the state with the moments under TorchTitan's names
 * (optimizer.state.NAME.exp_avg, .exp_avg_sq) into *out (freed by the caller,
 * names with it: one allocation). */
static int titan_decls(const tsr_model_decls *d, tsr_tensor_decl **out, tsr_error *err) {
    size_t n = d->n_params, names = 0;
    for (size_t p = 0; p < n; p++) names += 2 * (strlen(d->decls[p].name) + 40);
    tsr_tensor_decl *v = malloc(3 * n * sizeof *v + names);
    if (!v) return tsr_err(err, TSR_ENOMEM, "out of memory");
    char *at = (char *)(v + 3 * n);
    memcpy(v, d->decls, 3 * n * sizeof *v);
    for (int k = 1; k <= 2; k++)
        for (size_t p = 0; p < n; p++) {
            int len = sprintf(at, "optimizer.state.%s.%s", d->decls[p].name, TITAN_MOMENT[k - 1]);
            v[k * n + p].name = at;
            at += len + 1;
        }
    *out = v;
    return 0;
}

/* The step of a PyTorch checkpoint: TorchTitan's train_state.step, else AdamW's
 * own count of the first parameter (optimizer.state.NAME.step): a tensor of one
 * integer or float element. */
static int titan_step(tsr_ckpt *ck, const char *first, int *step, tsr_error *err) {
    char alt[600];
    snprintf(alt, sizeof alt, "optimizer.state.%s.step", first);
    const char *names[2] = {"train_state.step", alt};
    for (int i = 0; i < 2; i++) {
        long t = tsr_ckpt_find(ck, names[i]);
        if (t < 0) continue;
        tsr_tensor_info ti;
        tsr_ckpt_tensor(ck, (size_t)t, &ti);
        uint64_t vol = 1;
        for (uint32_t d = 0; d < ti.ndim; d++) vol *= ti.shape[d];
        union {
            int32_t i32;
            int64_t i64;
            float f32;
            double f64;
            uint8_t b[8];
        } u = {0};
        tsr_box box = {ti.ndim, {0}, {0}};
        for (uint32_t d = 0; d < ti.ndim; d++) box.extent[d] = 1;
        int ok = vol == 1 && (ti.dtype == TSR_I32 || ti.dtype == TSR_I64 || ti.dtype == TSR_F32 || ti.dtype == TSR_F64);
        if (!ok)
            return tsr_err(err, TSR_ECORRUPT, "%s: %s is not one integer or float (%s, %llu elements)",
                           tsr_ckpt_dir(ck), names[i], tsr_dtype_name(ti.dtype), (unsigned long long)vol);
        int rc = tsr_ckpt_read(ck, (size_t)t, &box, u.b, err);
        if (rc) return rc;
        double v = ti.dtype == TSR_I32 ? u.i32 : ti.dtype == TSR_I64 ? (double)u.i64 : ti.dtype == TSR_F32 ? u.f32 : u.f64;
        if (!(v >= 0 && v <= INT_MAX && v == (double)(int)v))
            return tsr_err(err, TSR_ECORRUPT, "%s: %s = %g: not a step", tsr_ckpt_dir(ck), names[i], v);
        *step = (int)v;
        return 0;
    }
    return tsr_err(err, TSR_ENOTFOUND, "%s: a checkpoint of PyTorch with no step: neither train_state.step nor %s",
                   tsr_ckpt_dir(ck), alt);
}

/* A poisoned checkpoint named by checkpoint.load_step: refused, naming the
 * tensors that hold non-finite values (FORMAT.md 4.5) and the override. */
static int refuse_poisoned(const tsr_train_config *c, const char *dir, tsr_error *err) {
    char names[768] = "";
    size_t off = 0, n_bad = 0;
    tsr_ckpt *ck = tsr_ckpt_open(dir, err);
    if (!ck) return err ? err->code : TSR_EIO;
    for (size_t i = 0; i < tsr_ckpt_n_tensors(ck); i++) {
        tsr_stats st;
        tsr_tensor_info t;
        if (tsr_ckpt_tensor_stats(ck, i, &st) != 1 || !st.nonfinite) continue;
        tsr_ckpt_tensor(ck, i, &t);
        if (n_bad++ < 8 && off < sizeof names)
            off += (size_t)snprintf(names + off, sizeof names - off, "%s%s (%llu)", n_bad > 1 ? ", " : "", t.name,
                                    (unsigned long long)st.nonfinite);
    }
    tsr_ckpt_close(ck);
    if (n_bad > 8 && off < sizeof names) snprintf(names + off, sizeof names - off, " and %zu more", n_bad - 8);
    return tsr_err(err, TSR_EINVAL,
                   "checkpoint.load_step=%d: %s is poisoned: non-finite values in %s%s; set "
                   "checkpoint.load_poisoned = true to load it anyway",
                   c->checkpoint.load_step, dir, n_bad ? "tensors " : "its state", names);
}

/* The checkpoint a job starts from: checkpoint.load_step under the root, else
 * the newest committed one there, else checkpoint.initial_load_path (then
 * *model_only as configured). @return 1 with its path in dir, 0 when there is
 * none, or a negative status. */
static int start_checkpoint(const tsr_train_config *c, const char *root, char *dir, size_t len, int *model_only,
                            tsr_error *err) {
    *model_only = 0;
    if (c->checkpoint.load_step >= 0) {
        char name[32];
        tsr_step_dir_name((uint64_t)c->checkpoint.load_step, name, sizeof name);
        if (tsr_job_join(dir, len, root, name)) return tsr_err(err, TSR_EINVAL, "%s: path too long", root);
        if (!tsr_ckpt_is_committed(dir))
            return tsr_err(err, TSR_ENOTFOUND, "checkpoint.load_step=%d: %s is not a committed checkpoint",
                           c->checkpoint.load_step, dir);
        if (!c->checkpoint.load_poisoned && tsr_step_poisoned(dir)) return refuse_poisoned(c, dir, err);
        return 1;
    }
    uint64_t s;
    if (tsr_latest_step(root, &s, dir, len) == 0) return 1;
    if (c->checkpoint.initial_load_path[0]) {
        snprintf(dir, len, "%s", c->checkpoint.initial_load_path);
        *model_only = c->checkpoint.initial_load_model_only;
        return 1;
    }
    return 0;
}

static int root_of(const tsr_train_config *c, char *root, size_t len, tsr_error *err) {
    return tsr_job_join(root, len, c->job.dump_folder, c->checkpoint.folder)
               ? tsr_err(err, TSR_EINVAL, "checkpoint.folder: path too long")
               : 0;
}

int tsr_train_start_shapes(const tsr_train_config *c, tsr_model_args *a, tsr_error *err) {
    char root[PATH_MAX], dir[PATH_MAX];
    int model_only, rc = root_of(c, root, sizeof root, err);
    if (!rc) rc = start_checkpoint(c, root, dir, sizeof dir, &model_only, err);
    if (rc == 0)
        return tsr_err(err, TSR_ENOTFOUND,
                       "model.flavor = \"checkpoint\": no checkpoint in %s and no checkpoint.initial_load_path", root);
    if (rc < 0) return rc;
    tsr_ckpt *ck = tsr_ckpt_open(dir, err);
    if (!ck) return err ? err->code : TSR_EIO;
    rc = tsr_model_args_from_ckpt(ck, a, err);
    tsr_ckpt_close(ck);
    return rc;
}

/* With the local tier: the newest step complete in the surviving node
 * memories (local_tier.h), unless the durable tier holds a newer one (rank 0
 * looks, every rank learns) or checkpoint.load_step names one. @return 1 with
 * this node's path of it in dir and *local set, 0 to look in the durable tier,
 * or a negative status. */
static int local_start(train_job *j, char *dir, size_t len, int *local, tsr_error *err) {
    const tsr_train_config *c = &j->t->cfg;
    *local = 0;
    if (c->checkpoint.load_step >= 0) return 0;
    int64_t durable = -1;
    uint64_t s = 0, step = 0;
    if (j->t->rank == 0 && tsr_latest_step(j->root, &s, NULL, 0) == 0) durable = (int64_t)s;
    int rc = tsr_comm_bcast(j->t->world, 0, &durable, sizeof durable, err);
    if (rc) return rc;
    tsr_error e = {0};
    int found = tsr_local_recover(j->local, durable, j->log, &step, dir, len, &e);
    if (found < 0 && j->log) fprintf(j->log, "local tier: %s; the durable tier then\n", e.msg);
    if (found <= 0 && durable >= 0 && j->log)
        fprintf(j->log, "local tier: no complete snapshot as new as the durable tier's step %lld\n", (long long)durable);
    *local = found > 0;
    return *local;
}

/* After a load: every rank has read what it needs; each node's first rank
 * removes its assembled step and the local tier's steps after the one loaded. */
static int local_loaded(train_job *j, uint64_t step, tsr_error *err) {
    int rc = tsr_comm_barrier(j->t->world, err);
    if (!rc) tsr_local_forget_after(j->local, step);
    return rc;
}

/* Resume from the checkpoint the job starts from, if any. *start is the step
 * it holds (0: none). */
/* The origins of AdamW's count and of the schedule that train.lr_scheduler
 * records ("... opt_origin=N lr_origin=N"; 0 where it records none: an older
 * checkpoint). */
static void saved_origins(tsr_ckpt *ck, int *opt, int *lr) {
    char *text = NULL;
    *opt = *lr = 0;
    if (read_blob(ck, B_SCHED, &text, NULL, NULL)) return;
    const char *o = strstr(text, "opt_origin="), *l = strstr(text, "lr_origin=");
    if (o) *opt = atoi(o + 11);
    if (l) *lr = atoi(l + 10);
    free(text);
}

static int resume(train_job *j, tsr_data_pos *pos, int *start, FILE *log, tsr_error *err) {
    const tsr_train_config *c = &j->t->cfg;
    const int ex = c->checkpoint.exclude_from_loading;
    char dir[PATH_MAX];
    int model_only = 0, local = 0, pytorch = 0, has_moments = 1;
    *start = 0;
    int found = j->local ? local_start(j, dir, sizeof dir, &local, err) : 0;
    if (!found) found = start_checkpoint(c, j->root, dir, sizeof dir, &model_only, err);
    if (found <= 0) {
        if (!found && tsr_trainer_init_params(j->t, err)) return err ? err->code : TSR_EIO;
        return found; /* a fresh run: nothing will overwrite them */
    }
    /* a checkpoint of PyTorch (TorchTitan's names through tessera.dcp): the
     * moments under TorchTitan's names, or the model alone without them */
    int rc = check_model(j, dir, &pytorch, &has_moments, err);
    if (!rc && pytorch && !has_moments) model_only = 1;
    /* the moments, unless the model alone is loaded or the optimizer left out
     * (checkpoint.exclude_from_loading: they stay zero, as a fresh AdamW's) */
    int moments = !model_only && !(ex & TSR_EXCLUDE_OPTIMIZER);
    tsr_tensor_decl *titan = NULL;
    if (!rc && pytorch && moments) rc = titan_decls(&j->t->decls, &titan, err);
    if (!rc) rc = state_boxes(j, !moments, err);
    tsr_state st = make_state(j, !moments);
    if (titan) st.tensors = titan;
    if (pytorch) st.n_blobs = 0; /* none of the trainer's */
    tsr_ckpt *ck = NULL;
    double t0 = tsr_now();
    if (!rc) rc = tsr_engine_load(j->engine, dir, &st, &ck, err);
    free(titan);
    if (rc) {
        tsr_err_prefix(err, "resume from %s", dir);
        return rc;
    }
    tsr_layout from = tsr_ckpt_layout(ck);
    char lf[128], lt[128];
    tsr_layout_format(&from, lf, sizeof lf);
    tsr_layout_format(&j->t->layout, lt, sizeof lt);
    int saved = 0, opt_origin = 0, lr_origin = 0;
    if (!model_only && pytorch) {
        /* the step from the checkpoint; the data position from the step: the
         * samples of that many global batches, in the order of training.seed */
        rc = titan_step(ck, j->t->decls.decls[0].name, &saved, err);
        uint64_t n = tsr_loader_samples(j->loader), used = (uint64_t)saved * (uint64_t)c->training.global_batch_size;
        if (!rc && n) *pos = (tsr_data_pos){used / n, used % n, (uint64_t)c->training.seed};
    } else if (!model_only) {
        char *b = NULL;
        size_t size = 0;
        if (!(rc = read_blob(ck, B_STEP, &b, &size, err))) {
            saved = size == 8 ? (int)tsr_ld64((uint8_t *)b) : -1;
            free(b);
        }
        if (!rc && !(rc = read_blob(ck, B_POS, &b, &size, err))) {
            if (size == TSR_DATA_POS_BYTES) tsr_data_pos_decode((uint8_t *)b, pos);
            else rc = tsr_err(err, TSR_ECORRUPT, "%s: blob train.data_pos of %zu bytes", dir, size);
            free(b);
        }
        saved_origins(ck, &opt_origin, &lr_origin);
    }
    if (!rc && !model_only && (saved < 0 || saved > c->training.steps + 1000000))
        rc = tsr_err(err, TSR_ECORRUPT, "%s: bad train.step", dir);
    if (!rc && !model_only) {
        /* what checkpoint.exclude_from_loading leaves out starts afresh here: the
         * step count (train_state), the data (dataloader), AdamW's count with
         * its zero moments (optimizer), the schedule (lr_scheduler); the counts
         * of what is loaded go on from where they were */
        *start = ex & TSR_EXCLUDE_TRAIN_STATE ? 0 : saved;
        if (ex & TSR_EXCLUDE_DATALOADER) *pos = (tsr_data_pos){0, 0, (uint64_t)c->training.seed};
        j->t->opt_origin = *start - (ex & TSR_EXCLUDE_OPTIMIZER ? 0 : saved - opt_origin);
        j->t->lr_origin = *start - (ex & TSR_EXCLUDE_LR_SCHEDULER ? 0 : saved - lr_origin);
    }
    tsr_ckpt_close(ck);
    char left[96] = "";
    if (!model_only && ex) {
        char names[80];
        snprintf(left, sizeof left, ", left out: %s", tsr_exclude_names(ex, names, sizeof names));
    }
    if (!rc && log)
        fprintf(log, "resumed from %s (the %s tier, step %d, saved as %s, loaded as %s%s%s%s) in %.3f s\n", dir,
                local ? "local" : "durable", *start, lf, lt,
                pytorch ? (has_moments ? ", PyTorch's names: the data position from the step"
                                       : ", PyTorch's names: no optimizer state in it")
                        : "",
                model_only ? ", model only" : "", left, tsr_now() - t0);
    if (!rc && j->local) rc = local_loaded(j, (uint64_t)*start, err);
    /* the step count from 0 again (train_state left out, or a PyTorch model
     * alone): the folder's steps are another run's future, moved aside by the
     * first save (kept, and no longer the newest) */
    if (!rc && ((!model_only && (ex & TSR_EXCLUDE_TRAIN_STATE)) || (pytorch && !has_moments)) && c->checkpoint.enable)
        tsr_engine_continue_from(j->engine, 0);
    return rc;
}

/* ----------------------------------------------------------------- engine */

/* Whether this host has a core that training leaves idle: this job's ranks on
 * the host (their host names gathered) times each one's OpenMP threads, against
 * the online cores. All ranks learn the same answer where hosts are alike. */
static int core_to_spare(tsr_comm *world, int *spare, tsr_error *err) {
    char host[256] = {0};
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
    uint8_t *all = NULL;
    size_t *counts = NULL;
    int rc = tsr_comm_allgatherv(world, host, sizeof host, &all, &counts, err);
    if (rc) return rc;
    long here = 0, cores = sysconf(_SC_NPROCESSORS_ONLN);
    for (uint32_t r = 0; r < tsr_comm_size(world); r++) here += !strncmp((char *)all + r * sizeof host, host, sizeof host);
    free(all), free(counts);
    *spare = cores > here * omp_get_max_threads();
    return 0;
}

/* The engine, with the job's checkpoint options; resumes from a checkpoint
 * when there is one. */
static int open_engine(train_job *j, tsr_error *err) {
    tsr_trainer *t = j->t;
    const tsr_train_config *c = &t->cfg;
    tsr_engine_opts eo = tsr_engine_opts_default();
    eo.keep_latest = (uint32_t)c->checkpoint.keep_latest_k;
    eo.sync = c->checkpoint.async_mode == TSR_ASYNC_DISABLED;
    eo.archive_url = c->checkpoint.archive_url;
    eo.archive_every = (uint64_t)c->checkpoint.archive_interval * (uint64_t)c->checkpoint.interval;
    eo.archive_keep = (uint32_t)c->checkpoint.archive_keep_latest_k;
    eo.commit_timeout_s = c->checkpoint.commit_timeout_s;
    eo.lock_root = c->checkpoint.enable; /* one writer per checkpoint folder */
    /* the launch's epoch (FORMAT.md 4.6): the supervisor's, else rank 0 fences
     * the folder in tsr_engine_new, before anything is loaded or saved, so that
     * a run by hand fences the writers before it too */
    eo.fence = c->checkpoint.enable;
    const char *ep = getenv(TSR_EPOCH_ENV);
    int rc = ep && *ep ? tsr_epoch_parse(ep, &eo.write.epoch, err) : 0;
    eo.overlap_staging = 1; /* the copy overlaps the next step: tsr_job_ckpt_staged() before its update */
    eo.write.codec = c->checkpoint.codec;
    eo.write.id_stride = tsr_comm_size(t->world); /* a leftover file is passed over, never written into */
    /* checkpoint.codec = "auto" encodes a frame when encoding keeps ahead of the disk;
     * with no core to spare from training, every frame encoded in the background
     * is paid for in step time, so the frames go raw (a forced codec stays) */
    int spare = 1;
    if (!rc && c->checkpoint.codec == TSR_CODEC_AUTO) rc = core_to_spare(t->world, &spare, err);
    if (!rc && !spare) eo.write.codec = TSR_CODEC_RAW;
    if (!rc) j->engine = tsr_engine_new(j->root, t->world, &eo, err);
    if (!rc && !j->engine) rc = err ? err->code : TSR_EIO;
    if (!rc && c->checkpoint.enable && c->checkpoint.local_interval > 0) {
        tsr_local_opts lo = {c->checkpoint.local_folder, c->job.dump_folder, c->checkpoint.local_nodes,
                             c->checkpoint.commit_timeout_s, tsr_engine_epoch(j->engine)};
        rc = tsr_local_root(lo.folder, lo.dump_folder, j->local_root, sizeof j->local_root, err);
        if (!rc) rc = tsr_local_open(&lo, t->world, &j->local, err);
    }
    tsr_heartbeat_send(j->hb, TSR_HB_LOAD, 0, 0, 0, 0);
    if (!rc) rc = resume(j, &j->pos, &j->start, j->log, err);
    /* steps after the one loaded (checkpoint.load_step) are an abandoned
     * future: the first save moves them aside */
    if (!rc && j->start > 0) tsr_engine_continue_from(j->engine, (uint64_t)j->start);
    /* the staging arena now, not in the first save: what this rank holds
     * (parameters and both moments, boxes aligned to TSR_ALIGN) and the blobs */
    size_t stage = 12 * t->n_shard_elems + TSR_ALIGN * 3 * t->decls.n_params + j->config_len + 4096 + 64 * N_BLOBS;
    if (!rc && c->checkpoint.enable) rc = tsr_engine_reserve(j->engine, stage, err);
    /* and the saves' plan: the first save then blocks no longer than the others */
    if (!rc && c->checkpoint.enable) {
        tsr_state st;
        rc = step_state(j, j->start, &st, err);
        if (!rc) rc = tsr_engine_prepare(j->engine, &st, err);
        double pinned = tsr_engine_pin_seconds(j->engine);
        if (!rc && pinned > 0 && j->log)
            fprintf(j->log, "checkpoint staging: %.0f MiB pinned for device copies in %.3f s, before the first step\n",
                    (double)stage / (1 << 20), pinned);
    }
    return rc;
}

int tsr_job_ckpt_open(train_job *j, tsr_error *err) {
    const tsr_train_config *c = &j->t->cfg;
    int rc = root_of(c, j->root, sizeof j->root, err);
    if (!rc && (c->checkpoint.enable || c->checkpoint.initial_load_path[0])) rc = open_engine(j, err);
    else if (!rc) rc = tsr_trainer_init_params(j->t, err);
    return rc;
}

/* ------------------------------------------------------------------ saves */

/* The checkpoint of `step`. A failed save is reported and training goes on,
 * unless the engine is broken: then no later save can succeed. */
static int save_step(train_job *j, int step, tsr_error *err) {
    tsr_heartbeat_send(j->hb, TSR_HB_SAVE, step, 0, 0, 0);
    tsr_state st;
    int rc = step_state(j, step, &st, err);
    if (rc) return rc;
    double pinned = tsr_engine_pin_seconds(j->engine);
    rc = tsr_engine_save(j->engine, (uint64_t)step, &st, err);
    pinned = tsr_engine_pin_seconds(j->engine) - pinned;
    if (pinned > 0 && j->log)
        fprintf(j->log, "step %d: %.3f s of this save's blocked time pinned the staging arena for device copies "
                        "(once)\n", step, pinned);
    j->last_save = step;
    j->last_save_refused = rc != 0;
    j->save_t0 = rc ? 0 : tsr_now() - tsr_engine_last_stall(j->engine) + tsr_engine_last_wait(j->engine);
    if (rc && err) j->last_save_err = *err;
    if (rc && tsr_engine_broken(j->engine)) {
        /* stop, to be restarted from the last committed checkpoint, rather than
         * train on without any */
        tsr_err_prefix(err, "step %d: checkpointing cannot go on; restart the job from its last "
                       "committed checkpoint", step);
        return rc;
    }
    if (rc && j->log) fprintf(j->log, "step %d: checkpoint failed: %s\n", step, err ? err->msg : "");
    return 0;
}

/* The snapshot of `step` in the local tier. A failed one is reported and
 * training goes on. */
static void local_step(train_job *j, int step) {
    tsr_error e = {0};
    tsr_heartbeat_send(j->hb, TSR_HB_SAVE, step, 0, 0, 0);
    tsr_state st;
    int rc = step_state(j, step, &st, &e);
    if (!rc) rc = tsr_local_save(j->local, (uint64_t)step, &st, &e);
    if (rc && j->log) fprintf(j->log, "step %d: local snapshot failed: %s\n", step, e.msg);
}

/* The time a checkpoint blocked the run. */
static void blocked(train_job *j, double since) {
    double b = tsr_now() - since;
    j->blocked += b;
    j->blocked_total += b;
}

static int save_due(const train_job *j, int step) {
    const tsr_train_config *c = &j->t->cfg;
    return c->checkpoint.enable && (step % c->checkpoint.interval == 0 || step == c->training.steps);
}

int tsr_job_ckpt_due(const train_job *j, int step) {
    return save_due(j, step) || (j->local && step % j->t->cfg.checkpoint.local_interval == 0) ||
           j->t->stop_agreed; /* preempted after this step: tsr_job_ckpt_preempt saves it */
}

int tsr_job_ckpt_step(train_job *j, int step, tsr_error *err) {
    const tsr_train_config *c = &j->t->cfg;
    int rc = 0;
    if (save_due(j, step)) {
        double t0 = tsr_now(); /* blocked: from here, not from the log line's writes, which every step pays */
        rc = save_step(j, step, err);
        blocked(j, t0);
    }
    if (!rc && j->local && step % c->checkpoint.local_interval == 0) {
        double t0 = tsr_now();
        local_step(j, step);
        blocked(j, t0);
    } else if (!rc) {
        tsr_local_poll(j->local); /* the last snapshot's partner copies, once it has committed */
    }
    /* the time of a save to its commit, as the steps see it (to a step's
     * length): what a preemption's grace must leave for one */
    int done = 0;
    tsr_error pe;
    if (j->save_t0 > 0 && j->engine && !tsr_engine_poll(j->engine, &done, &pe) && done)
        j->durable_s = tsr_now() - j->save_t0, j->save_t0 = 0;
    else if (done)
        j->save_t0 = 0; /* it failed: no measure */
    return rc;
}

/* The final model-only checkpoint in the export dtype: ROOT/model-step-N. */
static int save_model_only(train_job *j, int step, tsr_error *err) {
    tsr_trainer *t = j->t;
    int dtype = t->cfg.checkpoint.export_dtype;
    size_t n = t->decls.n_params;
    tsr_tensor_decl *decls = malloc(n * sizeof *decls);
    if (!decls) return tsr_err(err, TSR_ENOMEM, "out of memory");
    memcpy(decls, t->decls.decls, n * sizeof *decls);
    for (size_t p = 0; p < n; p++) decls[p].dtype = dtype;
    int rc = state_boxes(j, 1, err);
    uint16_t *conv = NULL;
    if (!rc && dtype == TSR_BF16) { /* cast where the weights are, by the trainer's kernels */
        conv = tsr_kc_alloc(&t->kc, (t->n_shard_elems ? t->n_shard_elems : 1) * sizeof *conv, err);
        if (!conv) rc = err ? err->code : TSR_ENOMEM;
        uint16_t *o = conv;
        for (size_t i = 0; !rc && i < j->n_boxes; i++) {
            uint64_t v = tsr_box_volume(&j->boxes[i].box);
            tsr_kc_f32_to_bf16(&t->kc, o, j->boxes[i].data, v);
            j->boxes[i].data = o;
            o += v;
        }
        if (!rc) rc = tsr_kc_sync(&t->kc, err);
    }
    tsr_state st = make_state(j, 1);
    st.tensors = decls;
    char dir[PATH_MAX], name[32];
    snprintf(name, sizeof name, "model-step-%08d", step);
    if (tsr_job_join(dir, sizeof dir, j->root, name)) rc = tsr_err(err, TSR_EINVAL, "%s: path too long", j->root);
    if (!rc) rc = tsr_engine_save_dir(j->engine, dir, (uint64_t)step, &st, err);
    if (!rc) rc = tsr_engine_wait(j->engine, err);
    tsr_kc_free(&t->kc, conv);
    free(decls);
    return rc;
}

/* After the last step: the last save completes, the model-only checkpoint is
 * written, and a failed checkpoint of the last step fails the run. */
int tsr_job_ckpt_finish(train_job *j, int rc, tsr_error *err) {
    const tsr_train_config *c = &j->t->cfg;
    tsr_error e2 = {0};
    if (!rc) tsr_local_flush(j->local);
    int last_rc = tsr_engine_wait(j->engine, &e2);
    if (j->last_save_refused) last_rc = j->last_save_err.code ? j->last_save_err.code : TSR_EIO, e2 = j->last_save_err;
    /* the job's last checkpoint failed: it is not a success, although
     * training went on after each failed save */
    int final_failed = !rc && last_rc && j->last_save == c->training.steps;
    if (last_rc && j->log && !final_failed) fprintf(j->log, "the last checkpoint failed: %s\n", e2.msg);
    if (!rc && !j->preempted && c->checkpoint.enable && c->checkpoint.last_save_model_only &&
        j->start < c->training.steps) {
        fill_blobs(j, c->training.steps, &j->pos);
        rc = save_model_only(j, c->training.steps, err);
        if (!rc && j->log)
            fprintf(j->log, "model-only checkpoint (%s): %s/model-step-%08d\n",
                    c->checkpoint.export_dtype == TSR_BF16 ? "bf16" : "f32", j->root, c->training.steps);
    }
    if (final_failed && !rc) {
        uint64_t newest = 0;
        char held[64] = "none";
        if (tsr_latest_step(j->root, &newest, NULL, 0) == 0) snprintf(held, sizeof held, "step %llu", (unsigned long long)newest);
        rc = tsr_err(err, last_rc, "the checkpoint of the last step (%d) failed; the newest committed checkpoint in %s is %s: %s",
                     j->last_save, j->root, held, e2.msg);
    }
    return rc;
}

#define PREEMPT_MARGIN 1.5 /* a durable save is begun in a preemption's grace if it took at most 1/1.5 of what is left */

int tsr_job_ckpt_preempt(train_job *j, int step, tsr_error *err) {
    tsr_trainer *t = j->t;
    double deadline = 0, t0 = tsr_now(), local_s = 0, durable_s = 0;
    /* the seconds count from the command (from now on a rank that the others'
     * vote stopped before the command reached it) */
    int asked = tsr_heartbeat_preempt(&t0, &deadline);
    int64_t local_at = -1, durable_at = -1; /* the steps each tier committed (-1: none) */
    j->preempted = 1;
    tsr_job_ckpt_staged(j); /* the copies in flight */
    if (j->local) {
        if (step % t->cfg.checkpoint.local_interval) local_step(j, step);
        tsr_local_flush(j->local); /* collective: its commit waited for */
        local_at = step;
        local_s = tsr_now() - t0;
    }
    /* every rank decides alike whether the durable tier's save fits: the least
     * slack (milliseconds left less the measured save's, with a margin) */
    int64_t slack = INT64_MAX;
    if (asked) {
        double left = deadline - tsr_now();
        slack = j->durable_s > 0 ? (int64_t)((left - PREEMPT_MARGIN * j->durable_s) * 1000) : INT64_MIN;
    }
    int rc = j->engine ? tsr_comm_allreduce_min(t->world, &slack, err) : 0;
    int fits = !rc && j->engine && slack >= 0;
    if (fits) {
        if (j->last_save != step) rc = save_step(j, step, err);
        tsr_error we = {0};
        if (!rc && !tsr_engine_wait(j->engine, &we) && !j->last_save_refused) {
            durable_at = step;
            durable_s = tsr_now() - t0;
        } else if (!rc && j->log) {
            fprintf(j->log, "preempted: the checkpoint of step %d failed: %s\n", step,
                    j->last_save_refused ? j->last_save_err.msg : we.msg);
        }
    }
    tsr_heartbeat_preempted(j->hb, step, local_at, durable_at, local_s, durable_s);
    if (j->log) {
        char d[128];
        if (durable_at >= 0)
            snprintf(d, sizeof d, "committed it in %.3f s", durable_s);
        else if (fits)
            snprintf(d, sizeof d, "did not commit it (above)");
        else if (j->durable_s > 0)
            snprintf(d, sizeof d, "not saved (its last save took %.3f s, more than the grace left)", j->durable_s);
        else
            snprintf(d, sizeof d, "not saved (no save of this run measured to fit the grace)");
        fprintf(j->log, "preempted after step %d: the local tier %s; the durable tier %s\n", step,
                local_at >= 0 ? "committed it" : "is off", d);
        fflush(j->log);
    }
    return rc;
}

/* Before each optimizer step: the copies of the last checkpoint and snapshot,
 * which overlap forward and backward, done; the wait counts as blocked. */
void tsr_job_ckpt_staged(void *ctx) {
    train_job *j = ctx;
    double t0 = tsr_now();
    if (j->engine) tsr_engine_staged(j->engine);
    tsr_local_staged(j->local);
    blocked(j, t0);
}

void tsr_job_ckpt_close(train_job *j) {
    tsr_local_free(j->local);
    if (j->engine) tsr_engine_free(j->engine);
    free(j->boxes);
}

