/* gdn.h - the gated DeltaNet mixer's forward (gdn.c), called by forward.c
 * for DFL_LAYER_RECURRENT layers. */
#ifndef DFL_GDN_H
#define DFL_GDN_H

#include "models/model.h"

/* Channels of the conv: q | k | v, 2 * k_heads * k_dim + v_heads * v_dim. */
int dfl_gdn_channels(const dfl_config *c);
/* One layer's recurrent state in floats (0 when no layer is recurrent): the
 * conv window (the last lin_conv - 1 inputs of every channel), then a
 * (k_dim, v_dim) matrix per value head. */
int dfl_gdn_state_floats(const dfl_config *c);

/* Layer l's mixer over the rows of n_seq sequences (sequence i's rows start
 * at row off[i], off[n_seq] rows in all): t->xn in, t->h1 out. Each
 * sequence's rows run the conv and the recurrence one row at a time in
 * order, from its live state, leaving the state after its row i in
 * snapshot i + 1 while snapshots last (dfl_kv_begin); a tree row whose
 * parent is not the row before it starts from its parent's snapshot. */
void dfl_gdn_layer(dfl_target *t, const dfl_layer *L, int l, dfl_fwd *f, const int *off,
                   int n_seq);

#endif
