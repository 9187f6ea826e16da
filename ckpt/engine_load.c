/* engine_load.c: a load on any layout, in phases: each needed box read once, by a
 * rank that needs it, and sent to the others that do.
 *   open   rank 0 reads the MANIFEST and broadcasts it; every rank opens it (at
 *          its own step_dir, if given: a copy of the same checkpoint on its node)
 *   plan   the state's tensors matched with the checkpoint's; every rank's boxes
 *          gathered and each distinct box given to one rank that holds it (the
 *          save plan's rule); receives posted for the boxes others read for me
 *   read   my boxes, in one tsr_ckpt_read_many_held: the frames they need,
 *          neighbouring ones read at once (one GET from a bucket), spread over
 *          threads, each read's digest share taken as it lands
 *   send   what I read, to every other rank that holds the same box, in
 *          pieces; each piece I receive has its digest share taken as it lands
 *   check  the digests (FORMAT.md 4.4): every rank's share of each tensor from
 *          the bytes it holds (its reads' shares and its received pieces'),
 *          summed over the ranks, against the MANIFEST's; in the same
 *          all-reduce every rank learns whether all loaded (without the
 *          check: agree, that alone) */
#include "engine_impl.h"
#include "mem.h"

#define TAG_MOD 32000 /* a box's message tag: its plan entry, modulo this */

/* A piece of a state box: rows [lo, hi) of its dim 0 (all of it for a 0-d
 * box), contiguous in its memory. A box goes between ranks in pieces of about
 * PIECE_BYTES, so that the receiver takes each piece's digest share while it is
 * in the cache, as it lands. */
typedef struct box_piece {
    size_t state_box;
    uint64_t lo, hi, share;
    size_t left; /* its requests not completed yet (a piece over 1 GiB has several) */
} box_piece;

#define PIECE_BYTES (2u << 20)

static int fault_load; /* engine_set_fault_load */

void engine_set_fault_load(int kind) {
    fault_load = kind;
    tsr_ckpt_set_fault_decode(kind == ENGINE_FAULT_DECODE);
}

typedef struct load {
    tsr_engine *e;
    const tsr_state *st;
    tsr_ckpt *ck;
    long *ck_tensor;      /* state tensor -> checkpoint tensor */
    all_boxes ab;         /* every rank's boxes */
    tsr_save_plan plan;   /* the rank that reads each distinct box */
    size_t *es;           /* element size of each state tensor */
    uint64_t *keys;       /* each state tensor's digest key; NULL: no digest check */
    uint8_t *by_digest;   /* each state tensor's: loaded whole, its digest checked (its frames' checksums not) */
    tsr_comm_reqs *reqs;  /* receives in flight, a piece's at a time */
    tsr_comm_reqs *sends; /* sends in flight */
    box_piece *recv;      /* the pieces received, in the order of their receives */
    size_t n_recv, cap_recv;
    size_t *req_piece;    /* each request of reqs: its piece in recv */
    size_t n_req, cap_req;
    long *mine_for;       /* plan entry -> my state box index, for entries I read */
    size_t *mine, n_mine; /* the state boxes I read */
    tsr_read_req *reads;  /* my reads: read_many's, one a box of mine (parallel to mine) */
    tsr_box *share_box;   /* each read's state box (its memory: the read's box but for engine_set_fault_load) */
    uint8_t *held;        /* each read's tensor is checked by its digest (by_digest) */
    uint64_t *share;      /* each read's digest share of what landed in its state box (when held) */
} load;

/* ----------------------------------------------------------------- open */

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
    if (step_dir) snprintf(dir, sizeof dir, "%s", step_dir); /* the same checkpoint, where this rank sees it */
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

/* ----------------------------------------------------------------- plan */

/* Each state tensor's index in the checkpoint, with the same dtype and shape.
 * Every rank learns whether all matched. */
static int match_tensors(load *l, tsr_error *err) {
    const tsr_state *st = l->st;
    int rc = 0;
    if (!(l->ck_tensor = malloc((st->n_tensors + 1) * sizeof *l->ck_tensor)))
        rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < st->n_tensors; i++) {
        const tsr_tensor_decl *t = &st->tensors[i];
        long k = tsr_ckpt_find(l->ck, t->name);
        tsr_tensor_info ti;
        if (k < 0) {
            rc = tsr_err(err, TSR_ENOTFOUND, "%s: no tensor %s in the checkpoint", tsr_ckpt_dir(l->ck), t->name);
            break;
        }
        tsr_ckpt_tensor(l->ck, (size_t)k, &ti);
        int same = ti.dtype == t->dtype && ti.ndim == t->ndim;
        for (uint32_t d = 0; same && d < t->ndim; d++) same = ti.shape[d] == t->shape[d];
        if (!same) {
            char a[160] = "", b[160] = "";
            for (uint32_t d = 0; d < ti.ndim; d++) snprintf(a + strlen(a), sizeof a - strlen(a), "%s%llu", d ? "," : "", (unsigned long long)ti.shape[d]);
            for (uint32_t d = 0; d < t->ndim; d++) snprintf(b + strlen(b), sizeof b - strlen(b), "%s%llu", d ? "," : "", (unsigned long long)t->shape[d]);
            rc = tsr_err(err, TSR_EINVAL, "%s: tensor %s is %s [%s] in the checkpoint, %s [%s] here",
                         tsr_ckpt_dir(l->ck), t->name, tsr_dtype_name(ti.dtype), a, tsr_dtype_name(t->dtype), b);
            break;
        }
        l->ck_tensor[i] = k;
    }
    /* every rank sees the same decls, but a rank's local failure must stop all */
    int64_t ok = rc == 0;
    tsr_comm_allreduce_min(l->e->comm, &ok, NULL);
    if (!ok && !rc) rc = tsr_err(err, TSR_EINVAL, "load refused on another rank");
    return rc;
}

/* The pieces of a box of `bytes` bytes and `rows` rows: about PIECE_BYTES
 * each, whole rows; piece c of them is rows [rows c / k, rows (c + 1) / k). */
static uint64_t pieces_of(uint64_t bytes, uint64_t rows) {
    uint64_t k = (bytes + PIECE_BYTES - 1) / PIECE_BYTES;
    return k > rows ? rows : k ? k : 1;
}

/* Sends (send: 1) or receives state box i (b) from or to rank `peer` in its
 * pieces; a received piece listed in l->recv, with its requests in
 * l->req_piece. */
static int transfer(load *l, int send, uint32_t peer, int tag, size_t i, const tsr_state_box *b, const void *data,
                    tsr_error *err) {
    tsr_engine *e = l->e;
    uint64_t rows = b->box.ndim ? b->box.extent[0] : 1, bytes = tsr_box_volume(&b->box) * l->es[b->tensor];
    uint64_t k = pieces_of(bytes, rows), row_bytes = bytes / rows;
    for (uint64_t c = 0; c < k; c++) {
        uint64_t lo = rows * c / k, hi = rows * (c + 1) / k;
        uint8_t *p = (uint8_t *)data + lo * row_bytes;
        if (send) {
            int rc = tsr_comm_isend(e->comm, peer, tag, p, (hi - lo) * row_bytes, l->sends, err);
            if (rc) return rc;
            continue;
        }
        if (tsr_grow((void **)&l->recv, &l->cap_recv, l->n_recv, sizeof *l->recv))
            return tsr_err(err, TSR_ENOMEM, "out of memory");
        size_t before = tsr_comm_reqs_count(l->reqs);
        int rc = tsr_comm_irecv(e->comm, peer, tag, p, (hi - lo) * row_bytes, l->reqs, err);
        size_t after = tsr_comm_reqs_count(l->reqs);
        l->recv[l->n_recv] = (box_piece){i, lo, hi, 0, after - before};
        for (size_t q = before; q < after; q++) {
            if (tsr_grow((void **)&l->req_piece, &l->cap_req, l->n_req, sizeof *l->req_piece))
                return tsr_err(err, TSR_ENOMEM, "out of memory");
            l->req_piece[l->n_req++] = l->n_recv;
        }
        l->n_recv++;
        if (rc) return rc;
    }
    return 0;
}

/* Receives for the boxes another rank reads for me; my own reads listed in
 * l->mine (a box twice in my state: read once, sent to myself). */
static int post_receives(load *l, tsr_error *err) {
    tsr_engine *e = l->e;
    const tsr_state *st = l->st;
    for (size_t i = 0; i < st->n_boxes; i++) {
        const tsr_state_box *b = &st->boxes[i];
        if (tsr_box_volume(&b->box) == 0) continue;
        long k = engine_plan_find(&l->plan, b->tensor, &b->box);
        if (k < 0) return tsr_err(err, TSR_EIO, "load plan lost a box of %s", st->tensors[b->tensor].name);
        uint32_t from = l->plan.writer[k];
        if (from == e->rank && l->mine_for[k] < 0) {
            l->mine_for[k] = (long)i;
            l->mine[l->n_mine++] = i;
            continue;
        }
        int rc = transfer(l, 0, from, (int)(k % TAG_MOD), i, b, b->data, err);
        if (rc) return rc;
    }
    return 0;
}

/* Which rank reads which box, from every rank's boxes; then the receives. */
static int plan_load(load *l, tsr_error *err) {
    tsr_engine *e = l->e;
    int rc = engine_gather_boxes(e->comm, l->st, &l->ab, err);
    if (!rc && !(l->es = engine_elem_sizes(l->st))) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    if (!rc) rc = tsr_save_plan_build(l->ab.held, l->ab.n_held, e->size, l->es, &l->plan, err);
    if (rc) return rc;
    l->reqs = tsr_comm_reqs_new();
    l->sends = tsr_comm_reqs_new();
    l->mine_for = malloc((l->plan.n + 1) * sizeof *l->mine_for);
    l->mine = malloc((l->st->n_boxes + 1) * sizeof *l->mine);
    for (size_t k = 0; l->mine_for && k < l->plan.n; k++) l->mine_for[k] = -1;
    if (!l->reqs || !l->sends || !l->mine_for || !l->mine) return tsr_err(err, TSR_ENOMEM, "out of memory");
    return post_receives(l, err);
}

/* ----------------------------------------------------------------- read */

/* The box that state box i of this rank is read as: itself, or under a planted
 * fault (engine_set_fault_load) another box of its tensor of the same extents. */
static tsr_box read_as(const load *l, size_t i) {
    const tsr_state_box *b = &l->st->boxes[i];
    const tsr_tensor_decl *t = &l->st->tensors[b->tensor];
    tsr_box as = b->box;
    uint32_t me = l->e->rank, from = fault_load == ENGINE_FAULT_SWAP ? (me ^ 1) : 0;
    if (fault_load == ENGINE_FAULT_SHIFT && as.ndim) {
        if (as.offset[0] + as.extent[0] < t->shape[0]) as.offset[0]++;
        else if (as.offset[0] > 0) as.offset[0]--;
    } else if ((fault_load == ENGINE_FAULT_SWAP && me < 2) || (fault_load == ENGINE_FAULT_BCAST && me > 0)) {
        for (size_t k = 0; from < l->e->size && k < l->ab.n_held[from]; k++) {
            const tsr_rank_box *o = &l->ab.held[from][k];
            int same = o->tensor == b->tensor && o->box.ndim == as.ndim;
            for (uint32_t d = 0; same && d < as.ndim; d++) same = o->box.extent[d] == as.extent[d];
            if (same) {
                as = o->box;
                break;
            }
        }
    }
    return as;
}

/* My boxes, in one tsr_ckpt_read_many_held: the frames they need, neighbouring
 * ones of a data file read at once, spread over threads; for a tensor the
 * digest check compares (by_digest), each read's share taken as it lands, as
 * the state box's own memory holds it (where a planted fault read it as
 * another box, the landed data counts where it lies in the state box). */
static int read_mine(load *l, tsr_error *err) {
    size_t n = l->n_mine;
    if (!n) return 0;
    l->reads = calloc(n, sizeof *l->reads);
    l->share_box = calloc(n, sizeof *l->share_box);
    l->held = calloc(n, 1);
    l->share = calloc(n, sizeof *l->share);
    if (!l->reads || !l->share_box || !l->held || !l->share) return tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t q = 0; q < n; q++) {
        const tsr_state_box *b = &l->st->boxes[l->mine[q]];
        l->reads[q] = (tsr_read_req){.tensor = (size_t)l->ck_tensor[b->tensor], .box = read_as(l, l->mine[q]),
                                     .dst = b->data};
        l->share_box[q] = b->box;
        l->held[q] = l->by_digest && l->by_digest[b->tensor];
    }
    return tsr_ckpt_read_many_held(l->ck, l->reads, n, l->held, l->share_box, l->share, l->e->opts.write.threads, err);
}

/* ----------------------------------------------------------------- send */

/* Waits for my receives; with the digest check (and no failure so far), each
 * piece's digest share is taken as it lands, while it is in the cache (for a
 * tensor the check compares: mark_by_digest). */
static int receive_all(load *l, int rc, tsr_error *err) {
    tsr_engine *e = l->e;
    if (rc || !l->keys) return tsr_comm_waitall(e->comm, l->reqs, err);
    for (;;) {
        size_t q;
        if ((rc = tsr_comm_waitany(e->comm, l->reqs, &q, err))) {
            tsr_comm_waitall(e->comm, l->reqs, NULL);
            return rc;
        }
        if (q == SIZE_MAX) return 0;
        box_piece *p = &l->recv[l->req_piece[q]];
        const tsr_state_box *b = &l->st->boxes[p->state_box];
        if (--p->left || !l->by_digest[b->tensor]) continue;
        tsr_box part = b->box;
        if (part.ndim) part.offset[0] += p->lo, part.extent[0] = p->hi - p->lo;
        p->share = tsr_digest_region(l->es[b->tensor], l->st->tensors[b->tensor].shape, &b->box, b->data, &part);
    }
}

/* Sends what I read to every other rank that holds the same box, in pieces
 * (also after a local failure: the receivers are waiting; the check or agree()
 * tells them), then waits for every transfer. @return rc, or the first failure here when rc is 0. */
static int send_read(load *l, int rc, tsr_error *err) {
    tsr_engine *e = l->e;
    if (!l->reqs || !l->sends) return rc; /* plan_load failed before its receives */
    uint8_t **sent = NULL; /* engine_set_fault_load's altered copies */
    size_t n_sent = 0, cap_sent = 0;
    for (uint32_t r = 0; l->mine_for && r < e->size; r++) {
        for (size_t i = 0; i < l->ab.n_held[r]; i++) {
            const tsr_rank_box *hb = &l->ab.held[r][i];
            if (tsr_box_volume(&hb->box) == 0) continue;
            long k = engine_plan_find(&l->plan, hb->tensor, &hb->box);
            if (k < 0 || l->plan.writer[k] != e->rank) continue;
            /* held[me][i] is st->boxes[i]: its first copy was read in place */
            if (r == e->rank && l->mine_for[k] == (long)i) continue;
            if (l->mine_for[k] < 0) continue; /* the receives stopped before it: rc is set */
            const tsr_state_box *src = &l->st->boxes[l->mine_for[k]];
            size_t bytes = tsr_box_volume(&src->box) * l->es[src->tensor];
            const void *data = src->data;
            if (fault_load == ENGINE_FAULT_SEND && !rc) { /* a copy with one bit flipped, freed below */
                uint8_t *bad = NULL;
                if (tsr_grow((void **)&sent, &cap_sent, n_sent, sizeof *sent) || !(bad = malloc(bytes))) {
                    free(bad);
                    rc = tsr_err(err, TSR_ENOMEM, "out of memory");
                    continue;
                }
                memcpy(bad, data, bytes);
                bad[bytes - 1] ^= 1; /* in its last piece */
                data = sent[n_sent++] = bad;
            }
            tsr_error se;
            if (transfer(l, 1, r, (int)(k % TAG_MOD), (size_t)l->mine_for[k], src, data, &se) && !rc) {
                rc = se.code;
                if (err) *err = se;
            }
        }
    }
    tsr_error we;
    if (receive_all(l, rc, &we) && !rc) {
        rc = we.code;
        if (err) *err = we;
    }
    if (tsr_comm_waitall(e->comm, l->sends, &we) && !rc) {
        rc = we.code;
        if (err) *err = we;
    }
    for (size_t i = 0; i < n_sent; i++) free(sent[i]);
    free(sent);
    return rc;
}

/* ---------------------------------------------------------------- agree */

/* Every rank learns whether every rank loaded. */
static int agree(load *l, int rc, tsr_error *err) {
    int64_t all_ok = rc == 0;
    tsr_comm_allreduce_min(l->e->comm, &all_ok, NULL);
    if (!rc && !all_ok) rc = tsr_err(err, TSR_EIO, "%s: the load failed on another rank", tsr_ckpt_dir(l->ck));
    return rc;
}

/* ---------------------------------------------------------------- check */

/* Each of my state boxes' digest share (share[i]): the xor of its reads'
 * shares, taken as they landed, for a box I read; of its pieces' shares, taken
 * as they were received, for one I received. */
static void box_shares(const load *l, uint64_t *share) {
    for (size_t q = 0; l->share && q < l->n_mine; q++) share[l->mine[q]] ^= l->share[q];
    for (size_t p = 0; p < l->n_recv; p++) share[l->recv[p].state_box] ^= l->recv[p].share;
}

/* The tensors whose digest the check will compare (every rank's plan is the
 * same: loaded whole, the MANIFEST holding a digest): their reads need not
 * compute their frames' checksums (of the stored bytes and of the decoded ones):
 * the digest proves what lands end to end, from the file through the decoder. */
static int mark_by_digest(load *l, tsr_error *err) {
    size_t nt = l->st->n_tensors;
    uint64_t *vol = calloc(nt + 1, sizeof *vol);
    l->by_digest = calloc(nt + 1, 1);
    if (!vol || !l->by_digest) {
        free(vol);
        return tsr_err(err, TSR_ENOMEM, "out of memory");
    }
    for (size_t k = 0; k < l->plan.n; k++) vol[l->plan.boxes[k].tensor] += tsr_box_volume(&l->plan.boxes[k].box);
    for (size_t t = 0; t < nt; t++) {
        uint64_t whole = 1, want;
        for (uint32_t d = 0; d < l->st->tensors[t].ndim; d++) whole *= l->st->tensors[t].shape[d];
        l->by_digest[t] = vol[t] == whole && tsr_ckpt_tensor_digest(l->ck, (size_t)l->ck_tensor[t], &want) == 1;
    }
    free(vol);
    return 0;
}

/* After the digest check refused the tensors marked in bad: this rank's reads
 * of them again, every frame's checksums computed (the load left them out where
 * the digest stands in for them), so that a frame stored or decoded wrong is
 * named. @return 0 (every frame sound: the boxes were read or sent wrong) or the
 * first failure, in *err. */
static int reread_checked(load *l, const uint8_t *bad, tsr_error *err) {
    for (size_t q = 0; l->reads && q < l->n_mine; q++) {
        const tsr_read_req *r = &l->reads[q];
        if (!bad[l->st->boxes[l->mine[q]].tensor]) continue;
        int rc = tsr_ckpt_read(l->ck, r->tensor, &r->box, r->dst, err);
        if (rc) return rc;
    }
    return 0;
}

/* The load's digest check (FORMAT.md 4.4), after every rank loaded, and the
 * ranks' agreement that every rank did (rc: this rank's outcome so far), in one
 * all-reduce of a pair of words a tensor and one for the outcome. The rank that
 * read box k counts its share once, in x (the xor over ranks: the tensor's CRC
 * as loaded, where the distinct boxes cover the tensor; a tensor loaded only
 * in part is not checked). Every copy counts besides, so that a copy received
 * wrong is caught as well as a box read wrong: in d, the sum over ranks, the
 * reader of k, held by h ranks in all, adds (1 - h) times its share and every
 * other holder its own once: 0 where every copy is the one read. The last
 * pair's sum counts the ranks that failed. Every rank learns the same refusals,
 * so the error is every rank's without a further agreement. */
static int check_digests(load *l, int rc, tsr_error *err) {
    const tsr_state *st = l->st;
    tsr_engine *e = l->e;
    size_t nt = st->n_tensors;
    uint64_t *v = calloc(2 * nt + 2, sizeof *v); /* x[t], d[t] at 2t, 2t+1; the failures at 2nt+1 */
    uint64_t *share = calloc(st->n_boxes + 1, sizeof *share);
    uint32_t *holders = calloc(l->plan.n + 1, sizeof *holders);
    uint8_t *refused = calloc(nt + 1, 1); /* the tensors the check refuses */
    if (!rc && (!v || !share || !holders || !refused)) rc = tsr_err(err, TSR_ENOMEM, "out of memory for the digest check");
    if (!rc) box_shares(l, share);
    for (uint32_t r = 0; !rc && r < e->size; r++)
        for (size_t i = 0; i < l->ab.n_held[r]; i++) {
            const tsr_rank_box *hb = &l->ab.held[r][i];
            long k = tsr_box_volume(&hb->box) ? engine_plan_find(&l->plan, hb->tensor, &hb->box) : -1;
            if (k >= 0) holders[k]++;
        }
    for (size_t i = 0; !rc && i < st->n_boxes; i++) {
        const tsr_state_box *b = &st->boxes[i];
        if (tsr_box_volume(&b->box) == 0) continue;
        long k = engine_plan_find(&l->plan, b->tensor, &b->box);
        if (k < 0 || (l->plan.writer[k] == e->rank && l->mine_for[k] == (long)i)) {
            v[2 * b->tensor] ^= share[i];
            if (k >= 0) v[2 * b->tensor + 1] += (1 - (uint64_t)holders[k]) * share[i];
        } else {
            v[2 * b->tensor + 1] += share[i];
        }
    }
    /* every rank takes part, also after a failure here (it counts itself failed);
     * without the few words of v it cannot: the others' all-reduce then waits
     * and MPI aborts the job (as open_everywhere's broadcast) */
    if (!v) {
        free(share), free(holders), free(refused);
        return rc;
    }
    if (rc) memset(v, 0, (2 * nt + 2) * sizeof *v), v[2 * nt + 1] = 1;
    tsr_error ae;
    if (tsr_comm_allreduce_xor_sum_u64(e->comm, v, nt + 1, &ae) && !rc && (rc = ae.code) && err) *err = ae;
    if (!rc && v[2 * nt + 1]) rc = tsr_err(err, TSR_EIO, "%s: the load failed on another rank", tsr_ckpt_dir(l->ck));
    size_t bad = 0;
    for (size_t t = 0; !rc && t < nt; t++) {
        uint64_t want = 0, got = v[2 * t] ^ l->keys[t], d = v[2 * t + 1];
        /* the tensors loaded whole with a digest (mark_by_digest) */
        if (!l->by_digest[t] || tsr_ckpt_tensor_digest(l->ck, (size_t)l->ck_tensor[t], &want) != 1 ||
            (got == want && d == 0))
            continue;
        refused[t] = 1;
        if (bad++) continue;
        if (got != want)
            tsr_err(err, TSR_ECORRUPT,
                    "%s: tensor %s: the digest of the data loaded is %016llx, the MANIFEST's %016llx (the frames' "
                    "checksums hold: the boxes were read or sent wrong)",
                    tsr_ckpt_dir(l->ck), st->tensors[t].name, (unsigned long long)got, (unsigned long long)want);
        else
            tsr_err(err, TSR_ECORRUPT,
                    "%s: tensor %s: the digest of the boxes read is the MANIFEST's (%016llx), but ranks that received "
                    "a copy of one hold other data (a box was sent wrong)",
                    tsr_ckpt_dir(l->ck), st->tensors[t].name, (unsigned long long)want);
    }
    if (bad > 1) tsr_err_prefix(err, "%zu tensors' digests differ; the first", bad);
    if (bad) rc = TSR_ECORRUPT;
    tsr_error fe = {0};
    if (bad && reread_checked(l, refused, &fe)) { /* a frame stored or decoded wrong: named */
        if (err) *err = fe;
        tsr_err_prefix(err, "the digest check refused %zu tensor%s; read again with every checksum", bad,
                       bad > 1 ? "s" : "");
    }
    free(v), free(share), free(holders), free(refused);
    return rc;
}

static void load_free(load *l) {
    tsr_comm_reqs_free(l->reqs);
    tsr_comm_reqs_free(l->sends);
    free(l->recv);
    free(l->req_piece);
    free(l->reads);
    free(l->share_box);
    free(l->held);
    free(l->share);
    free(l->mine);
    free(l->mine_for);
    tsr_save_plan_free(&l->plan);
    free(l->es);
    free(l->keys);
    free(l->by_digest);
    engine_all_boxes_free(&l->ab);
    free(l->ck_tensor);
}

/* Boxes in device memory are loaded through host memory: the load fills a view
 * of the state whose device boxes point at host buffers, which are then copied
 * to their devices. view_open(): the view (*boxes malloc'ed; a host buffer for
 * each device box), or the state itself when it has none. */
static int view_open(const tsr_state *st, tsr_state *view, tsr_state_box **boxes, tsr_error *err) {
    *view = *st;
    *boxes = NULL;
    size_t ndev = 0;
    for (size_t i = 0; i < st->n_boxes; i++) ndev += st->boxes[i].mem != TSR_MEM_HOST;
    if (!ndev) return 0;
    if (!(*boxes = calloc(st->n_boxes, sizeof **boxes))) return tsr_err(err, TSR_ENOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < st->n_boxes && !rc; i++) {
        const tsr_state_box *b = &st->boxes[i];
        (*boxes)[i] = *b;
        if (b->mem == TSR_MEM_HOST) continue;
        (*boxes)[i].data = NULL;
        size_t bytes = tsr_box_volume(&b->box) * tsr_dtype_size(st->tensors[b->tensor].dtype);
        if ((rc = tsr_mem_usable(b->mem, err))) tsr_err_prefix(err, "%s", st->tensors[b->tensor].name);
        else if (!((*boxes)[i].data = tsr_alloc_aligned(bytes ? bytes : 1)))
            rc = tsr_err(err, TSR_ENOMEM, "out of memory for a host copy of %s (%zu bytes)", st->tensors[b->tensor].name,
                         bytes);
        (*boxes)[i].mem = TSR_MEM_HOST;
    }
    view->boxes = *boxes;
    return rc;
}

/* view_close(): after a load that succeeded (ok), each device box gets its host
 * buffer; the buffers are freed either way. */
static int view_close(const tsr_state *st, tsr_state_box *boxes, int ok, tsr_error *err) {
    int rc = 0;
    for (size_t i = 0; boxes && i < st->n_boxes; i++) {
        const tsr_state_box *b = &st->boxes[i];
        if (b->mem == TSR_MEM_HOST) continue;
        size_t bytes = tsr_box_volume(&b->box) * tsr_dtype_size(st->tensors[b->tensor].dtype);
        if (ok && !rc && boxes[i].data && (rc = tsr_mem_from_host(b->data, boxes[i].data, bytes, b->mem, err)))
            tsr_err_prefix(err, "%s", st->tensors[b->tensor].name);
        free(boxes[i].data);
    }
    free(boxes);
    return rc;
}

static int load_host(tsr_engine *e, const char *step_dir, const tsr_state *st, tsr_ckpt **ck_out, tsr_error *err);

int tsr_engine_load(tsr_engine *e, const char *step_dir, const tsr_state *st, tsr_ckpt **ck_out, tsr_error *err) {
    int rc = engine_check_state(st, err);
    if (rc) return rc;
    tsr_state view;
    tsr_state_box *boxes = NULL;
    if ((rc = view_open(st, &view, &boxes, err))) {
        view_close(st, boxes, 0, NULL);
        return rc;
    }
    rc = load_host(e, step_dir, &view, ck_out, err);
    int rc2 = view_close(st, boxes, rc == 0, rc ? NULL : err);
    if (!rc && rc2 && ck_out) tsr_ckpt_close(*ck_out), *ck_out = NULL;
    return rc ? rc : rc2;
}

/* The load into host memory. */
static int load_host(tsr_engine *e, const char *step_dir, const tsr_state *st, tsr_ckpt **ck_out, tsr_error *err) {
    int rc = 0;
    tsr_ckpt *ck = open_everywhere(e, step_dir, err);
    if (!ck) return err ? err->code : TSR_EIO;
    load l = {.e = e, .st = st, .ck = ck};
    rc = match_tensors(&l, err);
    if (!rc) rc = plan_load(&l, err);
    if (!rc && !e->opts.no_digest_check && !(l.keys = malloc((st->n_tensors + 1) * sizeof *l.keys)))
        rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    for (size_t t = 0; !rc && l.keys && t < st->n_tensors; t++)
        l.keys[t] = tsr_digest_key(st->tensors[t].name, st->tensors[t].dtype);
    if (!rc && l.keys) rc = mark_by_digest(&l, err);
    if (!rc) rc = read_mine(&l, err);
    rc = send_read(&l, rc, err);
    rc = e->opts.no_digest_check ? agree(&l, rc, err) : check_digests(&l, rc, err);
    load_free(&l);
    if (rc || !ck_out) tsr_ckpt_close(ck);
    else *ck_out = ck;
    return rc;
}
