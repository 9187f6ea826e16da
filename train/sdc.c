/* sdc.c: silent data corruption caught while training (README, "Keeping a run
 * alive"). Tensors that several ranks hold must stay bitwise equal after every
 * optimizer step: the whole state (weights and both AdamW moments) of each
 * dp_replicate replica, and the tensors replicated over tp (the norm weights,
 * with their moments). Every training.sdc_check_interval steps, before every
 * checkpoint (durable or local tier: so every committed checkpoint was checked
 * at its own step, and a rollback to the newest one goes to checked state) and
 * at the last step, the holders compare hashes of what they hold:
 *
 *   1. hash: tsr_kc_hash_add (kernels/hash.h) over the rank's state, by the
 *      trainer's kernels where the state lives, into two words of its memory
 *      that come to the host in one copy: [0] the whole state, [1] the
 *      tp-replicated tensors;
 *   2. compare: an all-gather of (hash, world rank, host name) over each group
 *      of holders (the dp_replicate group for [0], the tp group for [1]): the
 *      control plane, 64 bytes a rank;
 *   3. verdict: a hash that a strict majority holds is right, and the holders
 *      of any other are named and blamed; without a majority (two holders
 *      that differ) every holder is named and none is blamed;
 *   4. agree: one all-reduce over the world, so that every rank fails the step
 *      together; under tessera launch every rank sends its TSR_HB_SDC record
 *      (train/heartbeat.h) first, those of the groups that differ before the
 *      all-reduce, so that the supervisor learns what happened before it sees
 *      any rank leave.
 *
 * The chaos fault of `tessera launch --chaos ...,bitflip` ends here too: the
 * supervisor's TSR_HB_CMD_BITFLIP is carried out at the next step boundary, on
 * the training thread, as a four-byte copy round trip through the kernel
 * context. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "job.h"

enum { HOLDER_BYTES = 64, HOST_BYTES = HOLDER_BYTES - 12 };

/* What a rank tells its group: its hash, its rank in the world, its host. */
typedef struct holder {
    uint64_t hash;
    uint32_t rank;
    char host[HOST_BYTES]; /* NUL-terminated, cut to fit */
} holder;

/* The two hashes of what this rank shares with others (above), queued on the
 * trainer's kernels and brought to the host in one copy. The state's index
 * runs over the weights, then the first and second moments, so that a word
 * moved between them changes the hash; the tp-replicated tensors are indexed
 * by their place among themselves (their offsets in the arena may differ
 * between tp ranks). */
static int state_hashes(train_job *j, uint64_t out[2], tsr_error *err) {
    tsr_trainer *t = j->t;
    size_t S = t->n_shard_elems;
    if (!j->sdc_hash && !(j->sdc_hash = tsr_kc_alloc(&t->kc, 2 * sizeof *j->sdc_hash, err))) return err ? err->code : TSR_ENOMEM;
    tsr_kc_zero(&t->kc, j->sdc_hash, 2 * sizeof *j->sdc_hash);
    if (t->layout.dp_replicate > 1) {
        tsr_kc_hash_add(&t->kc, &j->sdc_hash[0], t->arena, S, 0);              /* weights */
        tsr_kc_hash_add(&t->kc, &j->sdc_hash[0], t->arena + 2 * S, 2 * S, S); /* m, then v */
    }
    uint64_t k = 0;
    for (size_t p = 0; t->layout.tp > 1 && p < t->decls.n_params; p++) {
        const param *q = &t->par[p];
        if (!q->on_stage || !q->shard_n || t->decls.decls[p].placement.tp_dim >= 0) continue;
        tsr_kc_hash_add(&t->kc, &j->sdc_hash[1], q->w, q->shard_n, k);
        tsr_kc_hash_add(&t->kc, &j->sdc_hash[1], q->m, q->shard_n, k + q->shard_n);
        tsr_kc_hash_add(&t->kc, &j->sdc_hash[1], q->v, q->shard_n, k + 2 * q->shard_n);
        k += 3 * q->shard_n;
    }
    return tsr_kc_to_host(&t->kc, out, j->sdc_hash, 2 * sizeof *out, err);
}

/* The group's holders, in its rank order: each one's 64 bytes, gathered. */
static int gather_holders(tsr_comm *group, uint64_t hash, uint32_t rank, holder **out, int *n, tsr_error *err) {
    uint8_t mine[HOLDER_BYTES] = {0}, *all = NULL;
    size_t *counts = NULL;
    tsr_st64(mine, hash);
    tsr_st32(mine + 8, rank);
    if (gethostname((char *)mine + 12, HOST_BYTES - 1) != 0) snprintf((char *)mine + 12, HOST_BYTES, "?");
    mine[HOLDER_BYTES - 1] = 0;
    int rc = tsr_comm_allgatherv(group, mine, sizeof mine, &all, &counts, err);
    *n = (int)tsr_comm_size(group);
    if (!rc && !(*out = calloc((size_t)*n, sizeof **out))) rc = tsr_err(err, TSR_ENOMEM, "out of memory");
    for (int i = 0; !rc && i < *n; i++) {
        const uint8_t *b = all + (size_t)i * HOLDER_BYTES;
        (*out)[i].hash = tsr_ld64(b);
        (*out)[i].rank = tsr_ld32(b + 8);
        memcpy((*out)[i].host, b + 12, HOST_BYTES);
        (*out)[i].host[HOST_BYTES - 1] = 0;
    }
    free(all);
    free(counts);
    return rc;
}

/* The verdict of one group (step 3 above). */
typedef struct verdict {
    int holders, agree; /* the group's holders; those that hold my hash */
    int failed;         /* the holders differ */
    int majority;       /* a strict majority holds `right` */
    uint64_t right;
    int me;             /* the verdict on me: 0 not named, 1 named, 2 named and blamed */
} verdict;

static int count_of(const holder *h, int n, uint64_t hash) {
    int c = 0;
    for (int i = 0; i < n; i++) c += h[i].hash == hash;
    return c;
}

static verdict judge(const holder *h, int n, int me) {
    verdict v = {.holders = n, .agree = count_of(h, n, h[me].hash)};
    int most = 0;
    for (int i = 0; i < n; i++) {
        int c = count_of(h, n, h[i].hash);
        if (c > most) most = c, v.right = h[i].hash;
    }
    v.failed = most < n;
    v.majority = 2 * most > n;
    v.me = !v.failed ? 0 : !v.majority ? 1 : h[me].hash != v.right ? 2 : 0;
    return v;
}

/* The error of a group that failed: every hash with its holders, then who is
 * named. */
static void group_error(const holder *h, const verdict *v, int step, const char *what, tsr_error *err) {
    tsr_sbuf b = {0};
    tsr_sb_printf(&b, "step %d: silent data corruption: the %d copies of %s differ:", step, v->holders, what);
    for (int i = 0; i < v->holders; i++) {
        int first = 1;
        for (int k = 0; k < i && first; k++) first = h[k].hash != h[i].hash;
        if (!first) continue;
        tsr_sb_printf(&b, "%s hash %016llx held by", i ? ";" : "", (unsigned long long)h[i].hash);
        for (int k = i, m = 0; k < v->holders; k++)
            if (h[k].hash == h[i].hash) tsr_sb_printf(&b, "%s rank %u (host %s)", m++ ? "," : "", h[k].rank, h[k].host);
    }
    if (v->majority) {
        tsr_sb_printf(&b, "; the majority holds %016llx: named:", (unsigned long long)v->right);
        for (int i = 0, m = 0; i < v->holders; i++)
            if (h[i].hash != v->right) tsr_sb_printf(&b, "%s rank %u (host %s)", m++ ? "," : "", h[i].rank, h[i].host);
    } else {
        tsr_sb_printf(&b, "; no majority tells which copy is right: every holder is named, none blamed");
    }
    tsr_err(err, TSR_ECORRUPT, "%s", b.oom ? "silent data corruption (out of memory for the details)" : b.p);
    free(b.p);
}

/* One group's comparison: *v its verdict on this rank, err its message when it
 * failed. @return 0 (whatever the verdict), or a collective's failure. */
static int compare_group(train_job *j, tsr_comm *group, uint64_t hash, int step, const char *what, verdict *v,
                         tsr_error *gerr, tsr_error *err) {
    holder *h = NULL;
    int n = 0;
    int rc = gather_holders(group, hash, j->t->rank, &h, &n, err);
    if (!rc) {
        *v = judge(h, n, (int)tsr_comm_rank(group));
        if (v->failed) group_error(h, v, step, what, gerr);
    }
    free(h);
    return rc;
}

/* Whether the check runs after `step`: every sdc_check_interval steps, before
 * every checkpoint, at the last step; never where no tensor has two holders. */
static int check_due(const train_job *j, int step) {
    const tsr_train_config *c = &j->t->cfg;
    int every = c->training.sdc_check_interval;
    if (every <= 0 || (j->t->layout.dp_replicate <= 1 && j->t->layout.tp <= 1)) return 0;
    return step % every == 0 || step == c->training.steps || tsr_job_ckpt_due(j, step);
}

static int check(train_job *j, int step, tsr_error *err) {
    tsr_trainer *t = j->t;
    double t0 = tsr_now();
    uint64_t hash[2];
    int rc = state_hashes(j, hash, err);
    verdict v[2] = {{0}, {0}};
    tsr_error gerr[2] = {{0}, {0}};
    if (!rc && t->layout.dp_replicate > 1)
        rc = compare_group(j, t->rep, hash[0], step, "this rank's state (weights and AdamW moments) over dp_replicate",
                           &v[0], &gerr[0], err);
    if (!rc && t->layout.tp > 1)
        rc = compare_group(j, t->tp, hash[1], step, "the tensors replicated over tp (norm weights and their moments)",
                           &v[1], &gerr[1], err);
    int g = v[1].failed && (!v[0].failed || v[1].me > v[0].me); /* the group that says most of this rank */
    /* the supervisor hears from the ranks whose copies differ before the
     * all-reduce lets any rank fail its step (and leave), from the others
     * after it: a rank's record always comes before its end of stream */
    if (!rc && v[g].failed) tsr_heartbeat_sdc(j->hb, step, v[g].me, v[g].holders, v[g].agree);
    int64_t ok = !v[0].failed && !v[1].failed;
    if (!rc) rc = tsr_comm_allreduce_min(t->world, &ok, err);
    if (rc) return rc;
    j->sdc_seconds += tsr_now() - t0;
    j->sdc_checks++;
    if (ok) return 0;
    if (!v[g].failed) tsr_heartbeat_sdc(j->hb, step, 0, 0, 0);
    if (v[g].failed) {
        *err = gerr[g];
        return err->code;
    }
    return tsr_err(err, TSR_ECORRUPT,
                   "step %d: silent data corruption found by other ranks (their errors name the copies that differ); "
                   "this rank's copies agree", step);
}

/* The chaos bit flip (TSR_HB_CMD_BITFLIP's arg picks it): one mantissa bit
 * (the value changes by less than a factor 2 and stays finite: silent) of one
 * weight that another rank holds too: any of the state with dp_replicate,
 * else one of the tp-replicated weights. Said on stderr with the step after
 * which it happened. */
static int chaos_flip(train_job *j, int step, uint64_t arg, tsr_error *err) {
    tsr_trainer *t = j->t;
    size_t n = 0, at = 0;
    for (size_t p = 0; p < t->decls.n_params; p++) {
        const param *q = &t->par[p];
        if (q->on_stage && (t->layout.dp_replicate > 1 || t->decls.decls[p].placement.tp_dim < 0)) n += q->shard_n;
    }
    if (!n) return 0;
    size_t pick = (size_t)(arg % n), p = 0;
    for (; p < t->decls.n_params; p++) {
        const param *q = &t->par[p];
        if (!q->on_stage || !(t->layout.dp_replicate > 1 || t->decls.decls[p].placement.tp_dim < 0)) continue;
        if (pick < at + q->shard_n) break;
        at += q->shard_n;
    }
    int bit = (int)((arg >> 40) % 23);
    float *w = t->par[p].w + (pick - at);
    uint32_t word;
    int rc = tsr_kc_to_host(&t->kc, &word, w, sizeof word, err);
    word ^= 1u << bit;
    if (!rc) rc = tsr_kc_from_host(&t->kc, w, &word, sizeof word, err);
    if (!rc)
        fprintf(stderr, "tessera train: rank %u: chaos: flipped bit %d of element %zu of %s after step %d\n", t->rank,
                bit, pick - at, t->decls.decls[p].name, step);
    return rc;
}

int tsr_job_sdc_step(train_job *j, int step, tsr_error *err) {
    uint64_t arg;
    int rc = tsr_heartbeat_chaos_bitflip(&arg) ? chaos_flip(j, step, arg, err) : 0;
    if (!rc && check_due(j, step)) rc = check(j, step, err);
    return rc;
}
