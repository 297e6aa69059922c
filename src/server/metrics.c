/* metrics.c - server counters and their Prometheus text exposition (format 0.0.4). */
#include <stdio.h>
#include <string.h>

#include "server.h"

void srv_metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

/* The 10-second throughput window: one bucket per second, advanced lazily. */
static void win_advance(srv_metrics *m, double now) {
    if (m->win_t0 == 0) m->win_t0 = now;
    int steps = 0;
    while (now - m->win_t0 >= 1.0 && steps < 10) {
        m->win_pos = (m->win_pos + 1) % 10;
        m->win[m->win_pos] = 0;
        m->win_t0 += 1.0;
        steps++;
    }
    if (now - m->win_t0 >= 1.0) m->win_t0 = now;   /* idle for longer than the window */
}

void srv_metrics_tokens(srv_metrics *m, int n) {
    double now = srv_now();
    pthread_mutex_lock(&m->mu);
    win_advance(m, now);
    m->win[m->win_pos] += (uint64_t)n;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_job(srv_metrics *m, const srv_job *j) {
    pthread_mutex_lock(&m->mu);
    if (j->finish == SRV_FIN_CANCEL) m->req_cancelled++;
    else if (j->finish == SRV_FIN_ERROR) m->req_error++;
    else m->req_ok++;
    m->prompt_tokens += (uint64_t)j->n_prompt;
    m->cached_tokens += (uint64_t)j->n_cached;
    m->gen_tokens += (uint64_t)j->n_gen;
    m->t_prefill += j->st.t_prefill;
    m->t_decode += j->st.t_decode;
    m->rounds += j->st.rounds;
    m->proposed += j->st.proposed;
    m->accepted += j->st.accepted;
    m->committed += j->st.committed;
    m->shared_forwards += j->st.shared_forwards;
    m->shared_rows += j->st.shared_rows;
    m->classic_steps += j->st.classic_steps;
    for (int l = 0; l < DFL_LANES; l++) {
        m->lane_rounds[l] += j->st.lane_rounds[l];
        m->lane_proposed[l] += j->st.lane_proposed[l];
        m->lane_accepted[l] += j->st.lane_accepted[l];
        m->lane_committed[l] += j->st.lane_committed[l];
    }
    int r = j->st.accept_rule;
    if (j->st.rounds && r >= 0 && r < 3) {
        m->rule_rounds[r] += j->st.rounds;
        m->rule_proposed[r] += j->st.proposed;
        m->rule_accepted[r] += j->st.accepted;
        m->rule_committed[r] += j->st.committed;
        m->rule_tokens[r] += (uint64_t)j->n_gen;
        m->rule_t_decode[r] += j->st.t_decode;
    }
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_http(srv_metrics *m, int status) {
    int c = status / 100;
    pthread_mutex_lock(&m->mu);
    if (c >= 2 && c <= 5) m->http[c]++;
    pthread_mutex_unlock(&m->mu);
}

static void metric(srv_buf *b, const char *name, const char *type, const char *help,
                   double v) {
    char line[512];
    snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name,
             type, name, v);
    srv_buf_puts(b, line);
}

/* One gauge or counter with a value per acceptance rule. */
static void by_rule(srv_buf *b, const char *name, const char *type, const char *help,
                    const double v[3]) {
    static const char *rule[3] = {"exact", "rejection", "typical"};
    char line[512];
    snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    srv_buf_puts(b, line);
    for (int k = 0; k < 3; k++) {
        snprintf(line, sizeof line, "%s{rule=\"%s\"} %.17g\n", name, rule[k], v[k]);
        srv_buf_puts(b, line);
    }
}

/* One counter per lane that drafts rounds (dfl_lane_name). */
static void by_lane(srv_buf *b, const char *name, const char *help, const uint64_t v[DFL_LANES]) {
    char line[512];
    snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
    srv_buf_puts(b, line);
    for (int l = 0; l < DFL_LANES; l++) {
        snprintf(line, sizeof line, "%s{lane=\"%s\"} %llu\n", name, dfl_lane_name(l),
                 (unsigned long long)v[l]);
        srv_buf_puts(b, line);
    }
}

static void lane_metrics(srv_buf *b, const srv_metrics *c) {
    by_lane(b, "dflash_lane_rounds_total", "Speculative rounds, by the lane that drafted them.",
            c->lane_rounds);
    by_lane(b, "dflash_lane_proposed_total", "Draft tokens proposed, by lane.", c->lane_proposed);
    by_lane(b, "dflash_lane_accepted_total", "Draft tokens accepted by the target, by lane.",
            c->lane_accepted);
    by_lane(b, "dflash_lane_committed_total",
            "Tokens committed by speculative rounds (accepted + bonus), by lane.",
            c->lane_committed);
}

static void rule_metrics(srv_buf *b, const srv_metrics *c) {
    double rounds[3], acc[3], tau[3], tps[3];
    for (int k = 0; k < 3; k++) {
        rounds[k] = (double)c->rule_rounds[k];
        acc[k] = c->rule_proposed[k] ? (double)c->rule_accepted[k] / c->rule_proposed[k] : 0;
        tau[k] = c->rule_rounds[k] ? (double)c->rule_committed[k] / c->rule_rounds[k] : 0;
        tps[k] = c->rule_t_decode[k] > 0 ? c->rule_tokens[k] / c->rule_t_decode[k] : 0;
    }
    by_rule(b, "dflash_rule_rounds_total", "counter",
            "Speculative rounds, by acceptance rule.", rounds);
    by_rule(b, "dflash_rule_acceptance_rate", "gauge",
            "Accepted / proposed draft tokens, by acceptance rule.", acc);
    by_rule(b, "dflash_rule_tau", "gauge",
            "Tokens committed per speculative round, by acceptance rule.", tau);
    by_rule(b, "dflash_rule_decode_tokens_per_second", "gauge",
            "Generated tokens / decode seconds of requests that speculated, by rule.", tps);
}

char *srv_metrics_text(srv_server *srv, int queued, int busy) {
    srv_metrics c;
    pthread_mutex_lock(&srv->m.mu);
    win_advance(&srv->m, srv_now());
    c = srv->m;
    pthread_mutex_unlock(&srv->m.mu);

    uint64_t win = 0;
    for (int i = 0; i < 10; i++) win += c.win[i];
    srv_buf b = {0};
    char line[256];
    srv_buf_puts(&b, "# HELP dflash_http_responses_total HTTP responses sent, by status class.\n"
                     "# TYPE dflash_http_responses_total counter\n");
    for (int k = 2; k <= 5; k++) {
        if (k == 3) continue;
        snprintf(line, sizeof line, "dflash_http_responses_total{class=\"%dxx\"} %llu\n", k,
                 (unsigned long long)c.http[k]);
        srv_buf_puts(&b, line);
    }
    srv_buf_puts(&b, "# HELP dflash_requests_total Generation requests finished, by result.\n"
                     "# TYPE dflash_requests_total counter\n");
    const char *res[4] = {"ok", "cancelled", "error", "rejected"};
    uint64_t val[4] = {c.req_ok, c.req_cancelled, c.req_error, c.req_rejected};
    for (int k = 0; k < 4; k++) {
        snprintf(line, sizeof line, "dflash_requests_total{result=\"%s\"} %llu\n", res[k],
                 (unsigned long long)val[k]);
        srv_buf_puts(&b, line);
    }
    metric(&b, "dflash_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
           (double)c.prompt_tokens);
    metric(&b, "dflash_prompt_cached_tokens_total", "counter",
           "Prompt tokens reused from a slot's previous sequence (not prefilled again).",
           (double)c.cached_tokens);
    metric(&b, "dflash_generated_tokens_total", "counter", "Tokens generated.",
           (double)c.gen_tokens);
    metric(&b, "dflash_prefill_seconds_total", "counter", "Seconds spent in prompt prefill.",
           c.t_prefill);
    metric(&b, "dflash_decode_seconds_total", "counter", "Seconds spent generating.",
           c.t_decode);
    metric(&b, "dflash_tokens_per_second", "gauge",
           "Tokens generated per second over the last 10 seconds, all slots together.",
           (double)win / 10.0);
    metric(&b, "dflash_decode_tokens_per_second", "gauge",
           "Mean generation speed of one request (generated tokens / decode seconds).",
           c.t_decode > 0 ? (double)c.gen_tokens / c.t_decode : 0);
    metric(&b, "dflash_batched_forwards_total", "counter",
           "Decode forwards of a request that also carried other requests' rows.",
           (double)c.shared_forwards);
    metric(&b, "dflash_batched_rows_total", "counter",
           "Rows of other requests those forwards carried, summed.", (double)c.shared_rows);
    metric(&b, "dflash_spec_rounds_total", "counter",
           "Speculative rounds (one draft + one verify).", (double)c.rounds);
    metric(&b, "dflash_spec_proposed_total", "counter", "Draft tokens proposed.",
           (double)c.proposed);
    metric(&b, "dflash_spec_accepted_total", "counter", "Draft tokens accepted by the target.",
           (double)c.accepted);
    metric(&b, "dflash_spec_committed_total", "counter",
           "Tokens committed by speculative rounds (accepted + bonus).", (double)c.committed);
    metric(&b, "dflash_classic_steps_total", "counter", "Single-token decode steps.",
           (double)c.classic_steps);
    metric(&b, "dflash_spec_acceptance_rate", "gauge", "Accepted / proposed draft tokens.",
           c.proposed ? (double)c.accepted / (double)c.proposed : 0);
    metric(&b, "dflash_spec_tau", "gauge",
           "Mean tokens committed per speculative round (acceptance length with the bonus).",
           c.rounds ? (double)c.committed / (double)c.rounds : 0);
    rule_metrics(&b, &c);
    lane_metrics(&b, &c);
    metric(&b, "dflash_queue_depth", "gauge", "Requests waiting for a slot.", queued);
    metric(&b, "dflash_slots_busy", "gauge", "Slots generating now.", busy);
    metric(&b, "dflash_slots", "gauge", "Slots (--parallel).", srv_ready(srv) ? srv->n_slots : 0);
    metric(&b, "dflash_ready", "gauge", "1 once the model is loaded.", srv_ready(srv));
    return b.p;
}
