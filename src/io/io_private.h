/* io_private.h - helpers shared by the loaders in src/io (not part of io.h). */
#ifndef DFL_IO_PRIVATE_H
#define DFL_IO_PRIVATE_H

#include "io.h"

/* Appends a zeroed row to ts and returns it (grows geometrically); NULL with
 * DFL_ENOMEM in err when out of memory. */
dfl_tensor *dfl_tensors_push(dfl_tensors *ts, dfl_error *err);
/* Refuses two tensors with the same name among ts->t[0..n); O(n log n). */
int dfl_tensors_check_unique(const dfl_tensors *ts, const char *src, dfl_error *err);
/* Maps a regular, non-empty file read-only. */
int dfl_map_file(const char *path, dfl_mapping *m, dfl_error *err);
/* Adds m to ts->maps (ts then owns it); DFL_ENOMEM (m unmapped) when out of memory. */
int dfl_tensors_add_map(dfl_tensors *ts, dfl_mapping m, dfl_error *err);
/* Copies a name of len bytes; NULL if it holds a NUL byte. */
char *dfl_name_dup(const char *s, size_t len);

#endif
