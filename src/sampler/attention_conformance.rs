//! Attention's one conformance test: every implementation a CPU has (see `model::attention`),
//! over one table of cases, against the composed reference [`attend_one`] over each whole
//! sequence.
//!
//! The cases cover grouped-query ratios 1 to 8, head sizes with and without a tail past the
//! host kernels' 8 lanes, packed sequences of mixed length (one of a single token), and sliding
//! windows of 1 up to longer than the sequence. Each implementation runs every case in the way it
//! is used: the contiguous ones ([`fused`], [`block`] at several query-block sizes) on the whole
//! packed step, output and the three gradients; the host paged cache as a prefill chunk then
//! decode steps through scattered blocks of the case's block size (a sliding-window layer through
//! its rings). Tolerances are f32's: 1e-5 on outputs, 1e-4 on gradients; bf16 within its
//! resolution. The GPU's paged kernel is checked against the host cache in `tests/cuda.rs`.
//! Knows nothing of models beyond the config a cache is sized by.

use candle_core::{DType, Device, Tensor, Var};

use super::block_pool::{BlockPool, BlockTable};
use super::kv_cache::{KvCache, PagedAttention, SeqStep};
use super::state_slots::StateSlots;
use crate::model::attention::block::{self, causal_mask};
use crate::model::attention::{attend_one, fused, AttentionBackend, CausalAttention};
use crate::model::tests::max_abs_diff;
use crate::model::ModelConfig;

/// A step of packed sequences: query heads, KV heads, head size, the sequences' lengths, the
/// sliding window, and the paged cache's block size (which picks the host kernel).
struct Case {
    hq: usize,
    hkv: usize,
    d: usize,
    lens: &'static [usize],
    window: Option<usize>,
    block_size: usize,
}

const LONG: &[usize] = &[23, 9, 40];

/// The table: every host paged kernel (block sizes 32, 24, 16, 8, 4 and 5; head sizes 64, 40,
/// 32, 24, 16, 12, 8 and 6; query groups 1, 2, 3, 4 and 8, which the 8-lane kernels take in runs
/// of 4, 2 and 1 heads) with and without a window, and the windows the contiguous kernels treat
/// apart (1: only the query's own key; longer than every sequence).
fn cases() -> Vec<Case> {
    let c = |hq, hkv, d, lens, window, block_size| Case {
        hq,
        hkv,
        d,
        lens,
        window,
        block_size,
    };
    let mut all = Vec::new();
    for (bs, d, hq, hkv) in [
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
        all.push(c(hq, hkv, d, LONG, None, bs));
        all.push(c(hq, hkv, d, LONG, Some(7), bs));
    }
    all.extend([
        c(4, 2, 16, &[5, 1, 9], Some(3), 16),
        c(4, 1, 12, &[40], Some(1), 8),
        c(2, 2, 64, &[3, 37, 2], Some(20), 16),
        c(4, 2, 8, &[6], Some(64), 8),
        c(4, 2, 8, &[37], Some(16), 16),
    ]);
    all
}

impl Case {
    fn label(&self) -> String {
        format!(
            "{}/{} heads, d {}, lens {:?}, window {:?}",
            self.hq, self.hkv, self.d, self.lens, self.window
        )
    }

    fn tokens(&self) -> usize {
        self.lens.iter().sum()
    }

    /// Deterministic q (T, Hq, D), k and v (T, Hkv, D), sequences end to end.
    fn inputs(&self) -> [Var; 3] {
        let t = self.tokens();
        let x = |h: usize, seed: usize| {
            let vals: Vec<f32> = (0..t * h * self.d)
                .map(|i| (((i * 7 + seed * 13) * 2_654_435_761) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            Var::from_vec(vals, (t, h, self.d), &Device::Cpu).unwrap()
        };
        [x(self.hq, 0), x(self.hkv, 1), x(self.hkv, 2)]
    }

    /// The reference: each sequence's tokens over its own keys, through [`attend_one`].
    fn reference(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
        let mut outs = Vec::new();
        let mut start = 0;
        for &len in self.lens {
            let part = |x: &Tensor| x.narrow(0, start, len).unwrap();
            let mask = causal_mask(len, len, 0, self.window, q.device()).unwrap();
            outs.push(attend_one(&part(q), &part(k), &part(v), Some(&mask)).unwrap());
            start += len;
        }
        Tensor::cat(&outs, 0).unwrap()
    }

    /// The host paged cache's outputs for every token: each sequence's first three quarters
    /// (the second sequence whole) as one prefill step, then a token per step, through blocks
    /// taken out of order. Layer 0 keeps its keys in blocks; layer 1 is the case's
    /// sliding-window layer, which keeps them in the sequences' rings.
    fn paged(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
        let (hq, hkv, d, bs) = (self.hq, self.hkv, self.d, self.block_size);
        let cfg = ModelConfig::parse(&format!(
            r#"{{"model_type": "gemma3_text", "hidden_size": {h}, "intermediate_size": 8,
            "num_hidden_layers": 2, "num_attention_heads": {hq}, "num_key_value_heads": {hkv},
            "head_dim": {d}, "vocab_size": 8, "max_position_embeddings": 512,
            "layer_types": ["full_attention", "sliding_attention"], "sliding_window": {w}}}"#,
            h = hq * d,
            w = self.window.unwrap_or(1)
        ))
        .unwrap();
        let layer = usize::from(self.window.is_some());
        let n = self.lens.len();
        let mut cache = KvCache::new(&cfg, bs, 64);
        let mut states = StateSlots::new(&cfg, n);
        let rings: Vec<usize> = (0..n).map(|_| states.alloc().unwrap().unwrap()).collect();
        let mut pool = BlockPool::new(64);
        let mut spare = BlockTable::default();
        spare.reserve(&mut pool, 0, 3 * bs, bs).unwrap();
        let mut tables = vec![BlockTable::default(); n];
        let vecs = [q, k, v].map(|x| x.flatten_all().unwrap().to_vec1::<f32>().unwrap());
        let starts: Vec<usize> = self
            .lens
            .iter()
            .scan(0, |at, &l| {
                *at += l;
                Some(*at - l)
            })
            .collect();
        let mut outs: Vec<Vec<f32>> = vec![Vec::new(); n];
        let mut done = vec![0usize; n];
        let mut first = true;
        while done.iter().zip(self.lens).any(|(a, l)| a < l) {
            let take: Vec<usize> = (0..n)
                .map(|s| {
                    let len = self.lens[s];
                    let want = match (first, s) {
                        (true, 1) => len,
                        (true, _) => (len - len / 4).max(1),
                        _ => 1,
                    };
                    want.min(len - done[s])
                })
                .collect();
            let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
            for s in 0..n {
                tables[s].reserve(&mut pool, done[s], take[s], bs).unwrap();
                let rows = starts[s] + done[s]..starts[s] + done[s] + take[s];
                qs.extend_from_slice(&vecs[0][rows.start * hq * d..rows.end * hq * d]);
                ks.extend_from_slice(&vecs[1][rows.start * hkv * d..rows.end * hkv * d]);
                vs.extend_from_slice(&vecs[2][rows.start * hkv * d..rows.end * hkv * d]);
            }
            let t: usize = take.iter().sum();
            let seqs = (0..n)
                .map(|s| SeqStep {
                    block_table: &tables[s],
                    start_pos: done[s],
                    num_new: take[s],
                })
                .collect();
            let mut out = vec![f32::NAN; t * hq * d];
            PagedAttention::new(&mut cache, seqs)
                .with_states(&mut states, rings.clone())
                .attend_host(layer, &qs, &ks, &vs, (t, hq, hkv, d), self.window, &mut out)
                .unwrap();
            let mut at = 0;
            for s in 0..n {
                let len = take[s] * hq * d;
                outs[s].extend_from_slice(&out[at..at + len]);
                at += len;
                done[s] += take[s];
            }
            first = false;
        }
        let flat: Vec<f32> = outs.concat();
        Tensor::from_vec(flat, (self.tokens(), hq, d), &Device::Cpu).unwrap()
    }
}

/// The output and the gradients of q, k and v under a fixed upstream gradient.
fn with_grads(out: &Tensor, up: &Tensor, inputs: &[Var; 3]) -> [Tensor; 4] {
    let g = (out * up).unwrap().sum_all().unwrap().backward().unwrap();
    let grad = |x: &Var| g.get(x.as_tensor()).unwrap().clone();
    [
        out.clone(),
        grad(&inputs[0]),
        grad(&inputs[1]),
        grad(&inputs[2]),
    ]
}

fn assert_close(got: &[Tensor; 4], want: &[Tensor; 4], what: &str) {
    for (i, name) in ["output", "dq", "dk", "dv"].iter().enumerate() {
        let tol = if i == 0 { 1e-5 } else { 1e-4 };
        let diff = max_abs_diff(&got[i], &want[i]);
        assert!(diff < tol, "{what}: {name} differs by {diff}");
    }
}

#[test]
fn every_attention_implementation_equals_the_reference() {
    for case in cases() {
        let label = case.label();
        let inputs = case.inputs();
        let [q, k, v] = inputs.each_ref().map(|x| x.as_tensor().clone());
        let up = Tensor::randn(0f32, 1.0, q.dims(), &Device::Cpu).unwrap();
        let want = with_grads(&case.reference(&q, &k, &v), &up, &inputs);

        // the contiguous implementations: the fused CPU op, and the block attention as the
        // trainer calls it (one block) and with the queries in several blocks
        let fused = fused::fused_causal(&q, &k, &v, case.lens, case.window).unwrap();
        assert_close(
            &with_grads(&fused, &up, &inputs),
            &want,
            &format!("fused, {label}"),
        );
        for composed in [false, true] {
            let mut backend = CausalAttention::with_composed(case.lens.to_vec(), composed);
            let out = backend.attend(0, &q, &k, &v, case.window).unwrap();
            let what = format!("CausalAttention (composed {composed}), {label}");
            assert_close(&with_grads(&out, &up, &inputs), &want, &what);
        }
        for b in [1, 8, 16, 64] {
            let mut outs = Vec::new();
            let mut start = 0;
            for &len in case.lens {
                let part = |x: &Tensor| x.narrow(0, start, len).unwrap();
                outs.push(block::causal(&part(&q), &part(&k), &part(&v), b, case.window).unwrap());
                start += len;
            }
            let out = Tensor::cat(&outs, 0).unwrap();
            let what = format!("block attention (blocks of {b}), {label}");
            assert_close(&with_grads(&out, &up, &inputs), &want, &what);
        }

        // the host paged cache, in prefill and decode steps
        let paged = case.paged(&q, &k, &v);
        let diff = max_abs_diff(&paged, &want[0]);
        assert!(
            diff < 1e-5,
            "paged host cache (blocks of {}), {label}: output differs by {diff}",
            case.block_size
        );
    }
}

/// The block attention in bf16 (the GPU's training dtype) equals the f32 reference within
/// bf16's resolution.
#[test]
fn the_block_attention_in_bf16_stays_within_its_resolution() {
    let case = Case {
        hq: 4,
        hkv: 2,
        d: 8,
        lens: &[37],
        window: None,
        block_size: 16,
    };
    let [q, k, v] = case.inputs().map(|x| x.as_tensor().clone());
    let want = case.reference(&q, &k, &v);
    let bf = |x: &Tensor| x.to_dtype(DType::BF16).unwrap();
    let got = block::causal(&bf(&q), &bf(&k), &bf(&v), 8, None).unwrap();
    let diff = max_abs_diff(&got.to_dtype(DType::F32).unwrap(), &want);
    assert!(diff < 5e-2, "bf16 output differs by {diff}");
}
