//! Tests of [`super`] (`sampler/kv_cache.rs`).

use super::*;
use crate::model::attention::attend_one;
use crate::model::block_attention::causal_mask;
use crate::sampler::block_pool::BlockPool;
use crate::sampler::state_slots::StateSlots;

fn values(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i * 7 + seed * 13) * 2_654_435_761) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}

/// Every kernel (block sizes 32, 24, 16, 8, 4 and 5; head sizes 64, 40, 32, 24, 16, 12, 8
/// and 6; query groups 1, 2, 3, 4 and 8, which the 8-lane kernels take in runs of 4, 2 and
/// 1 heads): a prefill chunk then decode steps of three sequences through scattered
/// blocks give what attention over the whole sequence gives; and a sliding-window layer's
/// rings (prefill chunks longer than the window included) what a windowed mask gives.
#[test]
fn paged_attention_equals_attention_over_the_whole_sequence() {
    for &(bs, d, hq, hkv) in &[
        (16, 32, 8, 4),
        (32, 64, 4, 2),
        (8, 24, 4, 4),
        (4, 12, 4, 1),
        (5, 6, 2, 2),
        (16, 16, 8, 2),
        (16, 8, 6, 2),
        (8, 16, 8, 1),
        (24, 40, 2, 2),
    ] {
        // layer 1 is a sliding-window layer: each token sees its last 7 positions, kept in a
        // ring per sequence (in the state slots), not in the blocks
        let cfg = ModelConfig::parse(&format!(
            r#"{{"model_type": "gemma3_text", "hidden_size": {h}, "intermediate_size": 8,
            "num_hidden_layers": 2, "num_attention_heads": {hq}, "num_key_value_heads": {hkv},
            "head_dim": {d}, "vocab_size": 8, "max_position_embeddings": 512,
            "layer_types": ["full_attention", "sliding_attention"], "sliding_window": 7}}"#,
            h = hq * d
        ))
        .unwrap();
        assert_eq!(cfg.kv_layers(), vec![0]);
        let mut cache = KvCache::new(&cfg, bs, 64);
        let mut states = StateSlots::new(&cfg, 3);
        let ring_slots: Vec<usize> = (0..3).map(|_| states.alloc().unwrap().unwrap()).collect();
        let mut pool = BlockPool::new(64);
        // take some blocks first, so that the tables are not in order
        let mut spare = BlockTable::default();
        spare.reserve(&mut pool, 0, 3 * bs, bs).unwrap();
        let lens = [23usize, 9, 40];
        let mut tables = vec![BlockTable::default(); lens.len()];
        // the whole sequences' q, k, v: (len, heads, d)
        let all: Vec<_> = lens
            .iter()
            .enumerate()
            .map(|(s, &len)| {
                (
                    values(len * hq * d, 3 * s),
                    values(len * hkv * d, 3 * s + 1),
                    values(len * hkv * d, 3 * s + 2),
                )
            })
            .collect();
        let prefill = [20usize, 9, 31];
        for layer in 0..2 {
            let window = (layer == 1).then_some(7);
            let mut done = [0usize; 3];
            let mut step = 0;
            while done.iter().zip(&lens).any(|(d, l)| d < l) {
                // the first step is a prefill chunk, then one token per step
                let take: Vec<usize> = (0..3)
                    .map(|s| {
                        let want = if step == 0 { prefill[s] } else { 1 };
                        want.min(lens[s] - done[s])
                    })
                    .collect();
                if layer == 0 {
                    for s in 0..3 {
                        tables[s].reserve(&mut pool, done[s], take[s], bs).unwrap();
                    }
                }
                let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
                for s in 0..3 {
                    let r = done[s]..done[s] + take[s];
                    q.extend_from_slice(&all[s].0[r.start * hq * d..r.end * hq * d]);
                    k.extend_from_slice(&all[s].1[r.start * hkv * d..r.end * hkv * d]);
                    v.extend_from_slice(&all[s].2[r.start * hkv * d..r.end * hkv * d]);
                }
                let t: usize = take.iter().sum();
                let seqs = (0..3)
                    .map(|s| SeqStep {
                        block_table: &tables[s],
                        start_pos: done[s],
                        num_new: take[s],
                    })
                    .collect();
                let mut out = vec![f32::NAN; t * hq * d];
                PagedAttention::new(&mut cache, seqs)
                    .with_states(&mut states, ring_slots.clone())
                    .attend_host(layer, &q, &k, &v, (t, hq, hkv, d), window, &mut out)
                    .unwrap();
                // the reference: each sequence's new tokens over its whole prefix
                let mut row = 0;
                for s in 0..3 {
                    let (n, end) = (take[s], done[s] + take[s]);
                    if n == 0 {
                        continue;
                    }
                    let dev = candle_core::Device::Cpu;
                    let ten = |x: &[f32], h: usize, len: usize| {
                        Tensor::from_slice(&x[..len * h * d], (len, h, d), &dev).unwrap()
                    };
                    let qs = ten(&all[s].0[done[s] * hq * d..], hq, n);
                    let want = attend_one(
                        &qs,
                        &ten(&all[s].1, hkv, end),
                        &ten(&all[s].2, hkv, end),
                        Some(&causal_mask(n, end, done[s], window, &dev).unwrap()),
                    )
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap();
                    let got = &out[row * hq * d..(row + n) * hq * d];
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (g - w).abs() < 1e-5,
                            "bs {bs} d {d} {hq}/{hkv} heads, layer {layer} seq {s} value \
                             {i}: {g} vs {w}"
                        );
                    }
                    row += n;
                    done[s] = end;
                }
                step += 1;
            }
        }
    }
}
