/* static.c - the web page's files: which file under --path DIR a URL names
 * (never one outside DIR, nor a hidden one), and the content type it goes out
 * with. The page itself (web/index.html) is compiled into the binary by
 * cmake/embed.cmake; http.c serves either. No MHD here, so the unit test
 * (tests/server/unit.c) checks the path rules alone. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "server.h"

/* One segment of a URL path: a name, not ".", "..", a hidden file, nor empty. */
static int segment_ok(const char *s, size_t n) {
    return n > 0 && s[0] != '.';
}

int srv_static_path(const char *root, const char *url, char *out, size_t cap) {
    if (!url || url[0] != '/') return -1;
    size_t n = strlen(url);
    if (n > SRV_STATIC_URL_MAX) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)url[i];
        if (ch < 0x20 || ch == 0x7f || ch == '\\') return -1;
    }
    /* segments between slashes; a trailing slash names the folder's index.html */
    for (const char *p = url + 1; *p;) {
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (!segment_ok(p, len)) return -1;
        p += len + (e != NULL);
    }
    const char *index = url[n - 1] == '/' ? "index.html" : "";
    int w = snprintf(out, cap, "%s%s%s", root, url, index);
    return w < 0 || (size_t)w >= cap ? -1 : 0;
}

const char *srv_static_type(const char *path) {
    static const struct {
        const char *ext, *type;
    } types[] = {
        {".html", "text/html; charset=utf-8"},  {".htm", "text/html; charset=utf-8"},
        {".css", "text/css; charset=utf-8"},    {".js", "text/javascript; charset=utf-8"},
        {".mjs", "text/javascript; charset=utf-8"}, {".json", "application/json"},
        {".txt", "text/plain; charset=utf-8"},  {".md", "text/plain; charset=utf-8"},
        {".svg", "image/svg+xml"},              {".png", "image/png"},
        {".jpg", "image/jpeg"},                 {".jpeg", "image/jpeg"},
        {".gif", "image/gif"},                  {".webp", "image/webp"},
        {".ico", "image/x-icon"},               {".woff2", "font/woff2"},
        {".woff", "font/woff"},                 {".wasm", "application/wasm"},
        {".map", "application/json"},
    };
    const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
    if (dot && (!slash || dot > slash))
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
            if (!strcasecmp(dot, types[i].ext)) return types[i].type;
    return "application/octet-stream";
}
