/* engine_load.c: a load on any layout: each needed box read once, by a rank
 * that needs it, and sent to the others that do. */
#include "engine_impl.h"

/* ---------------------------------------------------------------- load */

/* One read of the load: a region of a stored chunk into a state box. */
typedef struct read_item {
    size_t state_box; /* index into st->boxes */
    size_t chunk;     /* checkpoint chunk index */
    tsr_box region;
} read_item;

typedef struct load_ctx {
    tsr_ckpt *ck;
    const tsr_state *st;
    read_item *items;
    size_t n_items, cap_items;
    pthread_mutex_t mu;
    int rc;
    tsr_error err;
} load_ctx;


static void load_piece(void *ctx, size_t i, int worker) {
    load_ctx *l = ctx;
    const read_item *it = &l->items[i];
    const tsr_state_box *b = &l->st->boxes[it->state_box];
    tsr_error e = {0};
    int rc = tsr_ckpt_read_chunk(l->ck, it->chunk, &it->region, b->data, &b->box, &e);
    if (rc) {
        pthread_mutex_lock(&l->mu);
        if (!l->rc) l->rc = rc, l->err = e;
        pthread_mutex_unlock(&l->mu);
    }
}

static int add_item(load_ctx *l, const read_item *it) {
    if (tsr_grow((void **)&l->items, &l->cap_items, l->n_items, sizeof *l->items)) return TSR_ENOMEM;
    l->items[l->n_items++] = *it;
    return 0;
}

/* Orders indices into the boxes of the tsr_state ctx by tensor. */
static int cmp_by_tensor(const void *a, const void *b, void *ctx) {
    const tsr_state *st = ctx;
    uint32_t x = st->boxes[*(const size_t *)a].tensor, y = st->boxes[*(const size_t *)b].tensor;
    return (x > y) - (x < y);
}

/* Adds one item per frame of the chunk that overlaps the region: a frame is then
 * decoded once, by one thread, and the threads share the work frame by frame. */
typedef struct frame_items {
    load_ctx *l;
    const tsr_mf_chunk *c;
    const tsr_box *region;
    size_t state_box, chunk;
} frame_items;

static int add_frame_item(void *user, uint64_t k) {
    frame_items *f = user;
    read_item it = {f->state_box, f->chunk, {0}};
    tsr_box fb;
    tsr_frame_box(f->c, k, &fb);
    if (!tsr_box_intersect(&fb, f->region, &it.region)) return 0;
    return add_item(f->l, &it);
}

/* The reads of the state boxes `mine` (n of them): per tensor, those boxes against
 * the stored chunks through the planner, each overlap cut along the frames. */
static int plan_reads(load_ctx *l, const long *ck_tensor, size_t *mine, size_t n, tsr_error *err) {
    tsr_ckpt *ck = l->ck;
    const tsr_state *st = l->st;
    size_t nc = tsr_ckpt_n_chunks(ck), nt = tsr_ckpt_n_tensors(ck);
    size_t *first = malloc((nt + 1) * sizeof *first);
    tsr_box *have = malloc((nc + 1) * sizeof *have), *need = malloc((n + 1) * sizeof *need);
    tsr_chunk_info *info = malloc((nc + 1) * sizeof *info);
    int rc = (!first || !have || !need || !info) ? tsr_err(err, TSR_ENOMEM, "out of memory") : 0;
    for (size_t t = 0; !rc && t <= nt; t++) first[t] = nc;
    for (size_t c = nc; !rc && c-- > 0;) { /* chunks are grouped by tensor */
        tsr_ckpt_chunk(ck, c, &info[c]);
        first[info[c].tensor] = c;
        have[c] = info[c].box;
    }
    tsr_sort_ctx(mine, n, sizeof *mine, cmp_by_tensor, (void *)st);
    for (size_t g = 0; !rc && g < n;) {
        uint32_t t = st->boxes[mine[g]].tensor;
        size_t h = g;
        for (; h < n && st->boxes[mine[h]].tensor == t; h++) need[h - g] = st->boxes[mine[h]].box;
        size_t ckt = (size_t)ck_tensor[t], c0 = first[ckt];
        tsr_tensor_info ti;
        tsr_ckpt_tensor(ck, ckt, &ti);
        tsr_overlap *ov = NULL;
        size_t nov = 0;
        rc = tsr_plan_overlaps(need, h - g, have + c0, ti.n_chunks, &ov, &nov, err);
        for (size_t k = 0; !rc && k < nov; k++) {
            const tsr_chunk_info *ci = &info[c0 + ov[k].have];
            tsr_mf_chunk mc = {.box = ci->box, .split_dim = ci->split_dim, .frame_rows = ci->frame_rows};
            frame_items f = {l, &mc, &ov[k].region, mine[g + ov[k].need], c0 + ov[k].have};
            if (tsr_frames_in(&mc, &ov[k].region, add_frame_item, &f)) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
        }
        free(ov);
        g = h;
    }
    free(first), free(have), free(need), free(info);
    return rc;
}

/* Rank 0 picks the directory and reads the MANIFEST; every rank opens it. */
static tsr_ckpt *open_everywhere(tsr_engine *e, const char *step_dir, tsr_error *err) {
    char dir[PATH_MAX];
    uint8_t *buf = NULL;
    size_t len = 0;
    int64_t hdr[2] = {0, 0}; /* status, length */
    tsr_error e0 = {0};
    if (e->rank == 0) {
        uint64_t step;
        if (step_dir) snprintf(dir, sizeof dir, "%s", step_dir);
        else if (tsr_latest_step(e->root, &step, dir, sizeof dir))
            hdr[0] = tsr_err(&e0, TSR_ENOTFOUND, "%s: no committed checkpoint", e->root);
        if (!hdr[0]) hdr[0] = tsr_ckpt_read_manifest(dir, &buf, &len, &e0);
        hdr[1] = (int64_t)len;
    }
    if (tsr_comm_bcast(e->comm, 0, hdr, sizeof hdr, err)) return NULL;
    if (hdr[0]) {
        char m[MSG_LEN] = {0};
        if (e->rank == 0) snprintf(m, sizeof m, "%s", e0.msg);
        tsr_comm_bcast(e->comm, 0, m, sizeof m, NULL);
        tsr_err(err, (int)hdr[0], "%s", m);
        free(buf);
        return NULL;
    }
    if (tsr_comm_bcast(e->comm, 0, dir, sizeof dir, err)) return NULL;
    if (e->rank != 0 && !(buf = malloc((size_t)hdr[1] + 1))) {
        tsr_err(err, TSR_ENOMEM, "out of memory");
        return NULL; /* the bcast below then hangs the others: MPI aborts the job */
    }
    if (tsr_comm_bcast(e->comm, 0, buf, (size_t)hdr[1], err)) {
        free(buf);
        return NULL;
    }
    tsr_ckpt *ck = tsr_ckpt_open_manifest(dir, buf, (size_t)hdr[1], err);
    free(buf);
    return ck;
}

int tsr_engine_load(tsr_engine *e, const char *step_dir, const tsr_state *st, tsr_ckpt **ck_out, tsr_error *err) {
    int rc = engine_check_state(st, err);
    if (rc) return rc;
    tsr_ckpt *ck = open_everywhere(e, step_dir, err);
    if (!ck) return err ? err->code : TSR_EIO;
    long *ck_tensor = malloc((st->n_tensors + 1) * sizeof *ck_tensor);
    if (!ck_tensor) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < st->n_tensors; i++) {
        const tsr_tensor_decl *t = &st->tensors[i];
        long k = tsr_ckpt_find(ck, t->name);
        tsr_tensor_info ti;
        if (k < 0) {
            rc = tsr_err(err, TSR_ENOTFOUND, "%s: no tensor %s in the checkpoint", tsr_ckpt_dir(ck), t->name);
            break;
        }
        tsr_ckpt_tensor(ck, (size_t)k, &ti);
        int same = ti.dtype == t->dtype && ti.ndim == t->ndim;
        for (uint32_t d = 0; same && d < t->ndim; d++) same = ti.shape[d] == t->shape[d];
        if (!same) {
            char a[160] = "", b[160] = "";
            for (uint32_t d = 0; d < ti.ndim; d++) snprintf(a + strlen(a), sizeof a - strlen(a), "%s%llu", d ? "," : "", (unsigned long long)ti.shape[d]);
            for (uint32_t d = 0; d < t->ndim; d++) snprintf(b + strlen(b), sizeof b - strlen(b), "%s%llu", d ? "," : "", (unsigned long long)t->shape[d]);
            rc = tsr_err(err, TSR_EINVAL, "%s: tensor %s is %s [%s] in the checkpoint, %s [%s] here", tsr_ckpt_dir(ck),
                         t->name, tsr_dtype_name(ti.dtype), a, tsr_dtype_name(t->dtype), b);
            break;
        }
        ck_tensor[i] = k;
    }
    /* every rank sees the same decls, but a rank's local failure must stop all */
    int64_t ok = rc == 0;
    tsr_comm_allreduce_min(e->comm, &ok, NULL);
    if (!ok && !rc) rc = tsr_err(err, TSR_EINVAL, "load refused on another rank");

    all_boxes ab = {0};
    tsr_save_plan plan = {0};
    size_t *es = NULL;
    if (!rc) rc = engine_gather_boxes(e->comm, st, &ab, err);
    if (!rc && !(es = engine_elem_sizes(st))) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!rc) rc = tsr_save_plan_build(ab.held, ab.n_held, e->size, es, &plan, err);

    tsr_comm_reqs *reqs = rc ? NULL : tsr_comm_reqs_new();
    load_ctx l = {.ck = ck, .st = st};
    pthread_mutex_init(&l.mu, NULL);
    long *mine_for = NULL; /* plan entry -> my state box index, for entries I read */
    size_t *mine = NULL, n_mine = 0;
    if (!rc && !reqs) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!rc && !(mine_for = malloc((plan.n + 1) * sizeof *mine_for))) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!rc && !(mine = malloc((st->n_boxes + 1) * sizeof *mine))) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t k = 0; !rc && k < plan.n; k++) mine_for[k] = -1;
    /* 1: receives for the boxes another rank reads for me */
    for (size_t i = 0; !rc && i < st->n_boxes; i++) {
        const tsr_state_box *b = &st->boxes[i];
        if (tsr_box_volume(&b->box) == 0) continue;
        long k = engine_plan_find(&plan, b->tensor, &b->box);
        if (k < 0) {
            rc = tsr_err(err, TSR_EIO, "load plan lost a box of %s", st->tensors[b->tensor].name);
            break;
        }
        size_t bytes = tsr_box_volume(&b->box) * es[b->tensor];
        if (plan.writer[k] == e->rank) {
            if (mine_for[k] < 0) {
                mine_for[k] = (long)i;
                mine[n_mine++] = i;
            } else { /* the same box twice in my own state: sent to myself after the read */
                rc = tsr_comm_irecv(e->comm, e->rank, (int)(k % TAG_MOD), b->data, bytes, reqs, err);
            }
        } else {
            rc = tsr_comm_irecv(e->comm, plan.writer[k], (int)(k % TAG_MOD), b->data, bytes, reqs, err);
        }
    }
    /* 2: my reads, planned against the stored chunks, spread over threads */
    if (!rc && n_mine) rc = plan_reads(&l, ck_tensor, mine, n_mine, err);
    if (!rc && l.n_items) {
        tsr_pool *pool = tsr_pool_new(e->opts.write.threads);
        if (!pool) rc = tsr_err(err, TSR_ENOMEM, "cannot start reader threads");
        else {
            tsr_pool_for(pool, l.n_items, load_piece, &l);
            tsr_pool_free(pool);
        }
        if (!rc && l.rc) {
            rc = l.rc;
            if (err) *err = l.err;
        }
    }
    /* 3: send what I read to every other rank that holds the same box (also on a
     * local read failure: the receivers are waiting; the status below tells them) */
    for (uint32_t r = 0; reqs && r < e->size; r++) {
        for (size_t i = 0; i < ab.n_held[r]; i++) {
            const tsr_rank_box *hb = &ab.held[r][i];
            if (tsr_box_volume(&hb->box) == 0) continue;
            long k = engine_plan_find(&plan, hb->tensor, &hb->box);
            if (k < 0 || plan.writer[k] != e->rank) continue;
            /* held[me][i] is st->boxes[i]: its first copy was read in place */
            if (r == e->rank && mine_for[k] == (long)i) continue;
            const tsr_state_box *src = &st->boxes[mine_for[k]];
            tsr_error se;
            if (tsr_comm_isend(e->comm, r, (int)(k % TAG_MOD), src->data,
                               tsr_box_volume(&src->box) * es[src->tensor], reqs, &se) && !rc) {
                rc = se.code;
                if (err) *err = se;
            }
        }
    }
    if (reqs) {
        tsr_error we;
        if (tsr_comm_waitall(e->comm, reqs, &we) && !rc) {
            rc = we.code;
            if (err) *err = we;
        }
    }
    /* everyone learns whether every rank loaded */
    int64_t all_ok = rc == 0;
    tsr_comm_allreduce_min(e->comm, &all_ok, NULL);
    if (!rc && !all_ok) rc = tsr_err(err, TSR_EIO, "%s: the load failed on another rank", tsr_ckpt_dir(ck));
    tsr_comm_reqs_free(reqs);
    pthread_mutex_destroy(&l.mu);
    free(l.items);
    free(mine);
    free(mine_for);
    tsr_save_plan_free(&plan);
    free(es);
    engine_all_boxes_free(&ab);
    free(ck_tensor);
    if (rc || !ck_out) tsr_ckpt_close(ck);
    else *ck_out = ck;
    return rc;
}
