/* cmd_serve.c - dflash serve: flags -> srv_opts; the server is src/server/. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "server/server.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: dflash serve -m MODEL [--draft DRAFTER] [options]\n\n"
            "An OpenAI-compatible HTTP server (see docs/server.md).\n\n"
            "  -m, --model PATH        target model: Hugging Face folder or .gguf\n"
            "  --draft PATH            DFlash drafter (greedy requests speculate with it)\n"
            "  --draft-mtp             draft with the model's own MTP head (mtp.* of a\n"
            "                          Qwen3.5 / Qwen3-Next folder); a request's\n"
            "                          block_size sets its drafts + 1; with --draft too,\n"
            "                          the head drafts as a lane of its own (mtp)\n"
            "  --tree-budget auto|N    draft trees (DDTree) of N nodes (1..32), 0: the chain,\n"
            "                          auto (default): the policy's pick; a request's\n"
            "                          tree_budget overrides it\n"
            "  --ngram                 also draft by prompt lookup (the n-gram lane), with or\n"
            "                          without a drafter; /metrics counts rounds by lane\n"
            "  --no-mmap, --mmap       copy the weights into memory (huge pages), or read the\n"
            "                          file in place; default: the copy when it takes at\n"
            "                          most half of the available memory (a faster decode\n"
            "                          for a read of the file at load)\n"
            "  --host ADDR             listen address (default 127.0.0.1; only this one)\n"
            "  --port N                TCP port (default 8080; 0 picks a free one)\n"
            "  -np, --parallel N       slots: requests generating at once (default 1)\n"
            "  -c, --ctx-size N        context tokens per slot (default: min(model, 4096))\n"
            "  --kv-type f16|f32       K/V cache elements (default f16: half the memory)\n"
            "  -t, --threads N         compute threads (default: all cores)\n"
            "  --api-key KEY           require 'Authorization: Bearer KEY' (all but /health);\n"
            "                          the environment's DFLASH_API_KEY is read when not given\n"
            "  --alias NAME            model id clients use (default: the model's name)\n"
            "  --lenient               ignore request fields this server does not implement\n"
            "                          (default: a 400 naming the field, as OpenAI answers)\n"
            "  --cors ORIGIN           let browser pages from ORIGIN ('*': any) call the API:\n"
            "                          CORS headers and OPTIONS preflight (default off)\n"
            "  --chat-template NAME    chatml, or Jinja text (default: the model's own)\n"
            "  --chat-template-file F  the Jinja chat template in file F\n"
            "  --dtype TYPE            convert weights at load (default: keep the file's)\n"
            "  --draft-dtype TYPE      the drafter's weights (default: as --dtype, else q8_0 for\n"
            "                          a 16-bit drafter beside a quantized target; auto: the file's);\n"
            "                          a quantized drafter drafts from a copy of a 16-bit lm_head\n"
            "                          in its type\n"
            "  --queue N               requests that may wait for a slot before 503 (default 64)\n"
            "  --max-body BYTES        request body limit (default 8388608)\n"
            "  --timeout S             idle connection timeout in seconds (default 120)\n"
            "  --read-timeout S        a request must arrive whole (headers and body) within\n"
            "                          S seconds of its start, else it is cut (default 30)\n"
            "  --max-connections N     open connections at most (default 1024)\n"
            "  --max-connections-per-ip N  of those, from one address (default 64)\n"
            "  --threads-http N        HTTP event-loop threads (default 4)\n"
            "  --heavy-requests N      requests with bodies over 256 KiB read or parsed at once;\n"
            "                          more get 503 (default 2)\n"
            "  --shutdown-grace S      on SIGINT/SIGTERM let running requests finish this long\n"
            "                          (default 10), then cancel them\n"
            "  --temp T                temperature for requests that give none (default 1,\n"
            "                          as OpenAI's API; 0 makes them greedy)\n"
            "  --reasoning-format F    deepseek (default): a <think> block of a chat answer goes\n"
            "                          out as reasoning_content; none: all of it is content\n"
            "  --path DIR              serve the web page's files from DIR instead of the\n"
            "                          compiled-in chat page (web/index.html)\n"
            "  --no-webui              no web page at / (the API only)\n"
            "  --replay-tau X          benchmarks only: a greedy request whose prompt was\n"
            "                          answered before replays that answer as the drafter's\n"
            "                          proposals at mean acceptance length X (bench/bench_serve.py)\n");
}

int cmd_serve(int argc, char **argv) {
#ifndef DFLASH_HAVE_MHD
    (void)argc, (void)argv;
    (void)usage;
    fprintf(stderr, "dflash serve: this build has no libmicrohttpd (install libmicrohttpd-dev "
                    "and rebuild)\n");
    return 2;
#else
    srv_opts o;
    srv_opts_default(&o);
    o.api_key = getenv("DFLASH_API_KEY");
    if (o.api_key && !*o.api_key) o.api_key = NULL;
    dfl_engine_opts env;
    dfl_engine_opts_default(&env);
    cli_engine_env(&env);
    o.allow_inexact = env.allow_inexact, o.draft_window = env.draft_window;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--lenient")) {   /* the options without a value */
            o.lenient = 1;
            continue;
        }
        if (!strcmp(a, "--draft-mtp")) {
            o.draft_mtp = 1;
            continue;
        }
        if (!strcmp(a, "--ngram")) {
            o.ngram = 1;
            continue;
        }
        if (!strcmp(a, "--no-mmap") || !strcmp(a, "--mmap")) {
            o.no_mmap = !strcmp(a, "--no-mmap");
            continue;
        }
        if (!strcmp(a, "--no-webui")) {
            o.no_webui = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "dflash serve: unknown option or missing value: %s\n\n", a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o.model_path = v;
        else if (!strcmp(a, "--draft") || !strcmp(a, "-md")) o.draft_path = v;
        else if (!strcmp(a, "--host")) o.host = v;
        else if (!strcmp(a, "--port")) o.port = cli_int(a, v, 0, 65535);
        else if (!strcmp(a, "-np") || !strcmp(a, "--parallel"))
            o.parallel = cli_int(a, v, 1, DFL_MAX_PARALLEL);
        else if (!strcmp(a, "--replay-tau")) o.replay_tau = cli_num(a, v, 1, DFL_MAX_BLOCK);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) o.ctx_size = cli_int(a, v, 0, 1 << 24);
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) o.threads = cli_int(a, v, 0, 1024);
        else if (!strcmp(a, "--api-key")) o.api_key = *v ? v : NULL;
        else if (!strcmp(a, "--alias")) o.alias = v;
        else if (!strcmp(a, "--path")) o.web_path = v;
        else if (!strcmp(a, "--cors")) o.cors = v;
        else if (!strcmp(a, "--chat-template")) o.chat_template = v;
        else if (!strcmp(a, "--chat-template-file")) o.chat_template = cli_chat_template_file(v);
        else if (!strcmp(a, "--dtype")) o.dtype = v;
        else if (!strcmp(a, "--draft-dtype")) o.draft_dtype = v;
        else if (!strcmp(a, "--kv-type")) o.kv_type = v;
        else if (!strcmp(a, "--queue")) o.queue_max = cli_int(a, v, 0, 1 << 16);
        else if (!strcmp(a, "--max-body")) o.max_body = (size_t)cli_int(a, v, 1024, 1L << 30);
        else if (!strcmp(a, "--timeout")) o.conn_timeout_s = cli_int(a, v, 1, 86400);
        else if (!strcmp(a, "--read-timeout")) o.read_timeout_s = cli_int(a, v, 1, 86400);
        else if (!strcmp(a, "--max-connections")) o.max_conns = cli_int(a, v, 4, 1 << 20);
        else if (!strcmp(a, "--max-connections-per-ip"))
            o.max_conns_per_ip = cli_int(a, v, 1, 1 << 20);
        else if (!strcmp(a, "--threads-http")) o.http_threads = cli_int(a, v, 1, 256);
        else if (!strcmp(a, "--heavy-requests")) o.heavy_max = cli_int(a, v, 1, 1024);
        else if (!strcmp(a, "--shutdown-grace")) o.shutdown_grace_s = cli_num(a, v, 0, 86400);
        else if (!strcmp(a, "--temp")) o.default_temp = cli_num(a, v, 0, 2);
        else if (!strcmp(a, "--tree-budget"))
            o.tree_budget = !strcmp(v, "auto") ? -1 : cli_int(a, v, 0, DFL_MAX_TREE);
        else if (!strcmp(a, "--reasoning-format")) {
            if (strcmp(v, "none") && strcmp(v, "deepseek")) {
                fprintf(stderr, "dflash serve: --reasoning-format %s: expected none or deepseek\n", v);
                return 2;
            }
            o.reasoning = !strcmp(v, "deepseek");
        }
        else {
            fprintf(stderr, "dflash serve: unknown option %s\n\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (o.http_threads > o.max_conns) {   /* each MHD thread takes a share of the connections */
        fprintf(stderr, "dflash serve: --threads-http %d is more than --max-connections %d\n",
                o.http_threads, o.max_conns);
        return 2;
    }
    struct stat st;
    if (o.web_path && (stat(o.web_path, &st) || !S_ISDIR(st.st_mode))) {
        fprintf(stderr, "dflash serve: --path %s: not a folder\n", o.web_path);
        return 2;
    }
    /* the built-in model brings its drafter, as in generate */
    if (!o.model_path && (o.model_path = cli_default_model()) && !o.draft_path && !o.draft_mtp)
        o.draft_path = cli_default_draft();
    if (!o.model_path) {
        fprintf(stderr, "dflash serve: no model: give -m PATH\n");
        return 2;
    }
    return srv_main(&o);
#endif
}
