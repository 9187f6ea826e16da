/* launch_preempt.c: preemption with a deadline (tessera launch
 * --preempt-grace S). A scheduler that preempts a job sends its supervisor
 * SIGTERM (Slurm sends SIGUSR1 before the end of an allocation, with
 * --signal); the supervisor tells every rank (TSR_HB_CMD_PREEMPT), the ranks
 * agree on a step to stop after (train/train_loop.c), commit its state to the
 * local tier and, where its measured save time fits, to the durable tier, and
 * report what they committed (TSR_HB_PREEMPTED); the supervisor ends the job
 * when the grace runs out and says whether the deadline was met and what the
 * next launch resumes from. */
#include <math.h>
#include <signal.h>
#include <string.h>

#include "common.h"
#include "launch.h"

static const char *sig_name(int sig) { return sig == SIGUSR1 ? "SIGUSR1" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

void launch_preempt_begin(launch *L, int sig) {
    L->preempting = 1;
    L->preempt_sig = sig;
    L->preempt_t0 = tsr_now();
    launch_event(L, "preempt", "\"signal\": \"%s\", \"grace_s\": %.3f, \"step\": %lld", sig_name(sig),
                 L->o.preempt_grace, (long long)L->last_step);
    launch_say("%s: preempted: the ranks stop after the step under way and commit it within %.1f s", sig_name(sig),
               L->o.preempt_grace);
    launch_tell(L, -1, TSR_HB_CMD_PREEMPT, (uint64_t)llround(L->o.preempt_grace * 1000), "preempt");
}

void launch_preempt_rank_up(launch *L, int rank) {
    if (!L->preempting) return;
    double left = L->preempt_t0 + L->o.preempt_grace - tsr_now();
    launch_tell(L, rank, TSR_HB_CMD_PREEMPT, (uint64_t)llround(fmax(0, left) * 1000), "preempt");
}

void launch_preempt_record(launch *L, int rank, const tsr_hb_record *r) {
    rank_state *s = &L->ranks[rank];
    s->pre_seen = 1;
    s->pre_step = r->step;
    s->pre_local = (int64_t)r->loss;
    s->pre_durable = (int64_t)r->grad_norm;
    s->pre_local_s = r->step_s;
    s->pre_durable_s = r->compute_s;
}

void launch_preempt_tick(launch *L) {
    if (!L->preempting || (int)L->out >= 0 || tsr_now() - L->preempt_t0 <= L->o.preempt_grace) return;
    L->out = OUT_PREEMPTED;
    L->culprit = -1;
    L->bad_step = L->last_step;
    snprintf(L->why, sizeof L->why, "the grace of %.1f s ran out", L->o.preempt_grace);
}

void launch_preempt_report(launch *L) {
    int all = L->np > 0;
    int64_t stop = -1, local = INT64_MAX, durable = INT64_MAX;
    double local_s = 0, durable_s = 0;
    for (int r = 0; r < L->np; r++) {
        const rank_state *s = &L->ranks[r];
        if (!s->pre_seen) {
            all = 0;
            continue;
        }
        if (s->pre_step > stop) stop = s->pre_step;
        if (s->pre_local < local) local = s->pre_local;
        if (s->pre_durable < durable) durable = s->pre_durable;
        local_s = fmax(local_s, s->pre_local_s);
        durable_s = fmax(durable_s, s->pre_durable_s);
    }
    /* a state counts when every rank committed its part of it */
    if (!all) local = durable = -1;
    double took = (L->preempt_end > 0 ? L->preempt_end : tsr_now()) - L->preempt_t0;
    int met = all && L->preempt_end > 0 && took <= L->o.preempt_grace;
    uint64_t newest = 0;
    int64_t durable_newest = tsr_latest_step(L->root, &newest, NULL, 0) == 0 ? (int64_t)newest : -1;
    int64_t resume = local > durable_newest ? local : durable_newest;
    const char *tier = resume < 0 ? "none" : local >= 0 && local >= durable_newest ? "local" : "durable";
    launch_event(L, "preempted", "\"signal\": \"%s\", \"step\": %lld, \"local_step\": %lld, \"durable_step\": %lld, "
                 "\"local_s\": %.3f, \"durable_s\": %.3f, \"seconds\": %.3f, \"grace_s\": %.3f, \"deadline_met\": %s, "
                 "\"resume_step\": %lld, \"resume_tier\": \"%s\"", sig_name(L->preempt_sig), (long long)stop,
                 (long long)local, (long long)durable, local_s, durable_s, took, L->o.preempt_grace,
                 met ? "true" : "false", (long long)resume, tier);
    char what[400];
    if (!all)
        snprintf(what, sizeof what, "not every rank reported its state (%s)", L->why);
    else
        snprintf(what, sizeof what, "the ranks stopped after step %lld; the local tier %s, the durable tier %s",
                 (long long)stop, local >= 0 ? "committed it" : "is off",
                 durable >= 0 ? "committed it" : "did not save it (no time for its measured save)");
    launch_say("preemption: %s, in %.1f s of the %.1f s grace (deadline %s)", what, took, L->o.preempt_grace,
               met ? "met" : "missed");
    if (resume < 0)
        launch_say("the next launch starts afresh: no state committed");
    else
        launch_say("the next launch resumes from step %lld (the %s tier%s)", (long long)resume, tier,
                   strcmp(tier, "local") ? "" : ", in the memory of these nodes: relaunch on them");
}
