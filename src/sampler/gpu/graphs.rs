//! CUDA graphs of the sampler's decode steps: a step's forward and LM head captured once per
//! plan ([`GraphPlan`]: the batch-size bucket the step is padded to, its block-table stride and
//! attention split) and replayed with one launch, as vLLM replays its decode steps.
//!
//! The first step of a plan runs eagerly (it loads the kernels' modules and warms cuBLAS); the
//! second is captured on the device's own stream (candle's default, the legacy stream, cannot
//! be captured) and replayed; later ones replay. The step's inputs are the words of its one
//! upload (`step_io.rs`), which comes before the launch; its intermediates live in memory the
//! graph allocates and frees itself (stream-ordered allocations become graph memory nodes); its
//! outputs, the hidden rows and the logits, are copied into kept buffers that the engine reads
//! after the launch. A graph remembers the addresses it read and wrote outside its own memory
//! (the upload buffer, the attention's partials, the kept outputs): when one of them moved (a
//! buffer grew), it is captured again.
//!
//! Safeguards, because a graph that reads the wrong memory samples wrong tokens without an
//! error:
//! - a captured graph with a copy from or to host memory (an upload from a temporary host buffer
//!   somewhere in the step, which a replay would read after it is freed) is refused;
//! - the launch right after each capture is checked against the same step run eagerly (the KV
//!   write is idempotent: same keys into the same slots; a recurrent model's states are kept
//!   before the launch and put back before the eager run: [`StepBody`]; a step whose states are
//!   too large to keep aside runs eagerly until some graph has passed its check, and is then
//!   captured unchecked), and a difference turns graphs off;
//! - a failed capture or launch turns graphs off, with the reason said once; the step runs
//!   eagerly (the stream is taken out of capture mode whatever failed).
//!
//! Knows nothing of the model, the cache or sampling: the caller's step body computes the
//! hidden rows and logits from the step's upload.

use std::collections::{HashMap, HashSet};

use candle_core::cuda_backend::cudarc::driver::{result, sys, CudaGraph};
use candle_core::{bail, CudaDevice, DType, Result, Tensor};

use crate::cuda::kernels::{driver, tensor_ptr};
use crate::sampler::gpu_plan::{bucket_for, decode_buckets, GraphPlan};

/// The addresses a graph of a step bakes in beyond its own memory: the upload buffer and the
/// split attention's partials (0 without a split); the kept outputs are added here.
pub type StepAddresses = [u64; 2];

/// How many graphs are kept before the least recently launched is dropped (each holds its
/// plan's intermediates in device memory while it lives).
const MAX_GRAPHS: usize = 64;

/// Bytes of state a new graph's check may always keep aside (a recurrent model's real rows:
/// ~53 MB a sequence at Qwen3.5-4B); beyond it, up to half the memory the device has free. A
/// larger step's graph is used unchecked once a graph of the same run has passed its check (the
/// same code under another plan), and runs eagerly before that.
const MIN_CHECK_SAVE: u64 = 1 << 30;

/// A captured graph that may move with its engine to another thread.
struct Graph(CudaGraph);

// SAFETY: CUDA graph objects may be used from any thread as long as calls on one graph are
// serialised (the driver API's graph thread-safety rules); a `Graph` is reached only through its
// `DecodeGraphs`, whose `&mut self` methods serialise every call. It is not `Sync`.
unsafe impl Send for Graph {}

struct Captured {
    graph: Graph,
    addresses: [u64; 4],
    /// When it was last launched, for the eviction.
    serial: u64,
}

/// The kept outputs: (rows, hidden) and (rows, vocab) in the model's dtype, for the largest
/// bucket; a step's rows are the first of them.
struct Kept {
    hidden: Tensor,
    logits: Tensor,
}

/// A sampler's decode graphs and the buffers they write.
pub struct DecodeGraphs {
    dev: CudaDevice,
    max_rows: usize,
    buckets: Vec<usize>,
    /// Off by the user's choice (`enforce_eager`).
    enabled: bool,
    graphs: HashMap<GraphPlan, Captured>,
    warm: HashSet<GraphPlan>,
    kept: Option<Kept>,
    /// Why graphs are off for the rest of the run.
    off: Option<String>,
    /// Whether some graph of this run has passed its check.
    verified: bool,
    serial: u64,
    /// Steps replayed, captured, and run eagerly under a plan (for the summary and the tests).
    pub counts: GraphCounts,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GraphCounts {
    pub replayed: u64,
    pub captured: u64,
    pub eager: u64,
}

/// A decode step as [`DecodeGraphs::run`] runs it: eagerly or inside a capture (`run`), and,
/// for the check of a captured graph, what the step changes besides the KV cache kept and put
/// back (a recurrent model's states, which a second run would advance twice).
pub trait StepBody {
    /// The step's hidden rows (plan rows, H) and logits (plan rows, V), from its upload.
    fn run(&mut self) -> Result<(Tensor, Tensor)>;
    /// Bytes [`Self::save`] would keep (0 when a run changes nothing to put back).
    fn save_bytes(&self) -> u64 {
        0
    }
    /// Keeps the state a run will change.
    fn save(&mut self) -> Result<()> {
        Ok(())
    }
    /// Puts back what [`Self::save`] kept.
    fn rewind(&mut self) -> Result<()> {
        Ok(())
    }
}

/// A step run under a plan: its hidden rows and logits, the step's rows of the kept buffers.
pub struct GraphOutput {
    pub hidden: Tensor,
    pub logits: Tensor,
}

impl DecodeGraphs {
    /// Graphs for steps of up to `max_rows` rows on `dev` (which must run on a stream of its
    /// own: [`crate::cuda::sampler_device`]).
    pub fn new(dev: &CudaDevice, max_rows: usize) -> DecodeGraphs {
        let legacy = dev.cuda_stream().cu_stream().is_null();
        DecodeGraphs {
            dev: dev.clone(),
            max_rows,
            buckets: decode_buckets(max_rows),
            enabled: true,
            graphs: HashMap::new(),
            warm: HashSet::new(),
            kept: None,
            off: legacy
                .then(|| "the device runs on the legacy stream, which cannot be captured".into()),
            verified: false,
            serial: 0,
            counts: GraphCounts::default(),
        }
    }

    /// Whether steps may run under a plan.
    pub fn on(&self) -> bool {
        self.enabled && self.off.is_none()
    }

    /// Graphs on or off by the user's choice (on unless `enforce_eager`).
    pub fn set_enabled(&mut self, on: bool) {
        self.enabled = on;
        if !on {
            self.graphs.clear();
        }
    }

    /// The bucket a decode step of `n` sequences is padded to.
    pub fn bucket(&self, n: usize) -> Option<usize> {
        bucket_for(&self.buckets, n)
    }

    /// Turns graphs off for the rest of the run, saying why once.
    pub fn turn_off(&mut self, why: String) {
        if self.off.is_none() {
            tracing::warn!(
                "CUDA graphs off for the rest of the run: {why}; decode steps run eagerly"
            );
            self.off = Some(why);
            self.graphs.clear();
        }
    }

    pub fn max_rows(&self) -> usize {
        self.max_rows
    }

    /// Runs a decode step of `n` real rows under `plan`: replayed, captured, or eagerly (see
    /// the module's doc). `body` computes the step from its upload, whose addresses (with the
    /// partials') are `addresses`.
    pub fn run(
        &mut self,
        plan: GraphPlan,
        addresses: StepAddresses,
        n: usize,
        body: &mut dyn StepBody,
    ) -> Result<GraphOutput> {
        if n > plan.rows || plan.rows > self.max_rows {
            bail!(
                "graph step: {n} rows in a plan of {} (at most {})",
                plan.rows,
                self.max_rows
            )
        }
        let Some(kept) = &self.kept else {
            // the first step under any plan: eager, and it sizes the kept outputs
            let (h, l) = body.run()?;
            self.keep(&h, &l)?;
            self.copy_out(&h, &l)?;
            self.warm.insert(plan);
            self.counts.eager += 1;
            return self.output(n);
        };
        let all = [
            addresses[0],
            addresses[1],
            tensor_ptr(&kept.hidden)?,
            tensor_ptr(&kept.logits)?,
        ];
        if !self.on() {
            let (h, l) = body.run()?;
            self.copy_out(&h, &l)?;
            self.counts.eager += 1;
            return self.output(n);
        }
        if let Some(c) = self.graphs.get(&plan) {
            if c.addresses == all {
                if let Err(e) = c.graph.0.launch() {
                    return self.eager_after(format!("a graph launch failed: {e:?}"), body, n);
                }
                self.counts.replayed += 1;
                self.serial += 1;
                if let Some(c) = self.graphs.get_mut(&plan) {
                    c.serial = self.serial;
                }
                return self.output(n);
            }
            // a buffer it reads or writes has moved: captured again below
            self.graphs.remove(&plan);
        }
        let check = body.save_bytes() <= self.check_cap();
        if !self.warm.contains(&plan) || (!check && !self.verified) {
            let (h, l) = body.run()?;
            self.copy_out(&h, &l)?;
            self.warm.insert(plan);
            self.counts.eager += 1;
            return self.output(n);
        }
        match self.capture(body) {
            Ok(graph) => {
                if check {
                    if let Err(e) = body.save() {
                        let why = format!("keeping a step's states for a graph's check: {e}");
                        return self.eager_after(why, body, n);
                    }
                }
                if let Err(e) = graph.launch() {
                    if check {
                        body.rewind()?;
                    }
                    return self.eager_after(format!("a graph launch failed: {e:?}"), body, n);
                }
                self.counts.captured += 1;
                self.evict();
                self.serial += 1;
                self.graphs.insert(
                    plan,
                    Captured {
                        graph: Graph(graph),
                        addresses: all,
                        serial: self.serial,
                    },
                );
                // the captured step itself is checked: a wrong graph is caught at once
                if check {
                    self.check_replay(plan, n, body)?;
                } else {
                    tracing::debug!(
                        "a graph of {} rows is used unchecked: its states ({} bytes) are too \
                         large to keep aside, and an earlier graph passed its check",
                        plan.rows,
                        body.save_bytes()
                    );
                }
                self.output(n)
            }
            Err(e) => {
                let why = format!("capturing a step of {} rows failed: {e}", plan.rows);
                self.eager_after(why, body, n)
            }
        }
    }

    /// Turns graphs off (`why`) and runs the step eagerly.
    fn eager_after(
        &mut self,
        why: String,
        body: &mut dyn StepBody,
        n: usize,
    ) -> Result<GraphOutput> {
        self.turn_off(why);
        let (h, l) = body.run()?;
        self.copy_out(&h, &l)?;
        self.counts.eager += 1;
        self.output(n)
    }

    /// Most bytes a new graph's check may keep aside now ([`MIN_CHECK_SAVE`]).
    fn check_cap(&self) -> u64 {
        let ctx = self.dev.cuda_stream().context().clone();
        let free = ctx
            .bind_to_thread()
            .and_then(|()| result::mem_get_info())
            .map_or(0, |(free, _)| free as u64);
        MIN_CHECK_SAVE.max(free / 2)
    }

    /// The step's rows of the kept outputs.
    fn output(&self, n: usize) -> Result<GraphOutput> {
        let Some(k) = &self.kept else {
            bail!("graph step: no kept outputs")
        };
        Ok(GraphOutput {
            hidden: k.hidden.narrow(0, 0, n)?,
            logits: k.logits.narrow(0, 0, n)?,
        })
    }

    /// The kept outputs for the largest bucket, shaped as the first step's.
    fn keep(&mut self, h: &Tensor, l: &Tensor) -> Result<()> {
        let alloc = |like: &Tensor| -> Result<Tensor> {
            let cols = like.dim(1)?;
            Tensor::zeros((self.max_rows, cols), like.dtype(), like.device())
        };
        self.kept = Some(Kept {
            hidden: alloc(h)?,
            logits: alloc(l)?,
        });
        Ok(())
    }

    /// Copies a step's hidden rows and logits into the first rows of the kept buffers: a
    /// device-to-device copy each, in stream order (captured as copy nodes).
    fn copy_out(&self, h: &Tensor, l: &Tensor) -> Result<()> {
        let Some(k) = &self.kept else {
            bail!("graph step: no kept outputs")
        };
        let stream = self.dev.cuda_stream();
        for (src, dst) in [(h, &k.hidden), (l, &k.logits)] {
            let (rows, cols) = src.dims2()?;
            if rows > dst.dim(0)? || cols != dst.dim(1)? || src.dtype() != dst.dtype() {
                bail!(
                    "graph step: output {:?} {:?} does not fit the kept {:?} {:?}",
                    src.dims(),
                    src.dtype(),
                    dst.dims(),
                    dst.dtype()
                )
            }
            let src = src.contiguous()?;
            let bytes = rows * cols * src.dtype().size_in_bytes();
            // SAFETY: both ranges hold `bytes` bytes on this device; stream order puts the copy
            // after the kernels that wrote `src` and before anything that reads `dst`.
            unsafe {
                driver(
                    "device copy",
                    result::memcpy_dtod_async(
                        tensor_ptr(dst)?,
                        tensor_ptr(&src)?,
                        bytes,
                        stream.cu_stream(),
                    ),
                )?;
            }
        }
        Ok(())
    }

    /// Captures `body` and the copies of its outputs into a graph, checked for host copies.
    /// Whatever fails, the stream leaves capture mode before this returns.
    fn capture(&mut self, body: &mut dyn StepBody) -> Result<CudaGraph> {
        let stream = self.dev.cuda_stream();
        driver(
            "begin capture",
            stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED),
        )?;
        // the step's intermediates are dropped inside the capture (their frees become nodes):
        // only the kept buffers outlive it
        let ran = body.run().and_then(|(h, l)| self.copy_out(&h, &l));
        // a free that failed inside an invalidated capture is stored in the context, and cudarc
        // returns a stored error before ending the capture: take it first
        let stale = stream.context().check_err();
        let flags = sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
        let ended = stream.end_capture(flags);
        if !matches!(
            stream.capture_status(),
            Ok(sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
        ) {
            let mut g = std::ptr::null_mut();
            // SAFETY: ends the capture cudarc could not end; the graph it gives (if any) is
            // destroyed unused.
            unsafe {
                let _ = sys::cuStreamEndCapture(stream.cu_stream(), &mut g);
                if !g.is_null() {
                    let _ = sys::cuGraphDestroy(g);
                }
            }
        }
        ran?;
        driver("capture", stale)?;
        let Some(graph) = driver("end capture", ended)? else {
            bail!("the capture recorded nothing")
        };
        host_copies(&graph)?;
        Ok(graph)
    }

    /// The launch of `plan`'s new graph against the same step run eagerly, after what the
    /// launch changed besides the KV cache is put back (the KV write puts the same keys into
    /// the same slots again): the logits of the real rows must agree (the same kernels on the
    /// same inputs). A difference turns graphs off, and the eager rows stand. Either way the
    /// step's state is the eager run's.
    fn check_replay(&mut self, plan: GraphPlan, n: usize, body: &mut dyn StepBody) -> Result<()> {
        if let Err(e) = body.rewind() {
            // the launch's outputs and states stand, unchecked; no graph runs again
            self.turn_off(format!(
                "putting a step's states back for a graph's check: {e}"
            ));
            return Ok(());
        }
        let (h, l) = body.run()?;
        let replayed = self.output(n)?.logits.to_dtype(DType::F32)?;
        let eager = l.narrow(0, 0, n)?.to_dtype(DType::F32)?;
        let diff = (&replayed - &eager)?.abs()?.max_all()?.to_scalar::<f32>()?;
        let scale = eager.abs()?.max_all()?.to_scalar::<f32>()?;
        // the same kernels give the same bits; a GEMM that picked another algorithm under
        // capture rounds differently but stays within bf16's spread of the logits' scale
        let tolerance = 1e-2 * scale.max(1.0);
        if diff.is_nan() || diff > tolerance {
            self.copy_out(&h, &l)?;
            self.turn_off(format!(
                "a replayed step of {} rows differs from the eager step by {diff} (logits up to \
                 {scale})",
                plan.rows
            ));
        } else {
            self.verified = true;
            if diff > 0.0 {
                tracing::debug!(
                    "replayed step of {} rows: logits within {diff} of the eager step's",
                    plan.rows
                );
            }
        }
        Ok(())
    }

    /// Drops the graph replayed least recently when there are too many.
    fn evict(&mut self) {
        if self.graphs.len() < MAX_GRAPHS {
            return;
        }
        if let Some(oldest) = self
            .graphs
            .iter()
            .min_by_key(|(_, c)| c.serial)
            .map(|(p, _)| *p)
        {
            self.graphs.remove(&oldest);
        }
    }
}

/// Refuses a graph with a copy from or to host memory: a step's upload from a temporary host
/// buffer would be read again, after it is freed, at every replay.
fn host_copies(graph: &CudaGraph) -> Result<()> {
    let g = graph.cu_graph();
    let mut count = 0usize;
    // SAFETY: `g` is the live graph `graph` owns; the first call asks for the count only.
    unsafe {
        driver(
            "graph nodes",
            sys::cuGraphGetNodes(g, std::ptr::null_mut(), &mut count).result(),
        )?;
    }
    let mut nodes = vec![std::ptr::null_mut(); count];
    // SAFETY: `nodes` holds `count` entries.
    unsafe {
        driver(
            "graph nodes",
            sys::cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut count).result(),
        )?;
    }
    // a copy captured through unified addressing says UNIFIED: the pointer's own type decides
    // (an address the driver does not know, such as pageable host memory, counts as host)
    let host = |t: sys::CUmemorytype, ptr: sys::CUdeviceptr| match t {
        sys::CUmemorytype::CU_MEMORYTYPE_HOST => true,
        sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED => {
            let mut kind: u32 = 0;
            // SAFETY: asks the driver about an address; writes one u32.
            let r = unsafe {
                sys::cuPointerGetAttribute(
                    (&mut kind as *mut u32).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                    ptr,
                )
            };
            r != sys::CUresult::CUDA_SUCCESS
                || kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32
        }
        _ => false,
    };
    for &node in &nodes[..count] {
        let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: `node` is one of the graph's nodes.
        unsafe {
            driver(
                "graph node",
                sys::cuGraphNodeGetType(node, &mut kind).result(),
            )?;
        }
        match kind {
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY => {
                // SAFETY: a memcpy node's parameters, into a plain C struct.
                let p = unsafe {
                    let mut p = std::mem::MaybeUninit::<sys::CUDA_MEMCPY3D>::zeroed();
                    driver(
                        "copy node",
                        sys::cuGraphMemcpyNodeGetParams(node, p.as_mut_ptr()).result(),
                    )?;
                    p.assume_init()
                };
                let src = if p.srcMemoryType == sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED
                    && p.srcDevice == 0
                {
                    p.srcHost as sys::CUdeviceptr
                } else {
                    p.srcDevice
                };
                let dst = if p.dstMemoryType == sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED
                    && p.dstDevice == 0
                {
                    p.dstHost as sys::CUdeviceptr
                } else {
                    p.dstDevice
                };
                if host(p.srcMemoryType, src) || host(p.dstMemoryType, dst) {
                    bail!(
                        "the step copies {} bytes between host and device inside the graph \
                         (an upload from a temporary host buffer)",
                        p.WidthInBytes * p.Height.max(1) * p.Depth.max(1)
                    )
                }
            }
            sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST => {
                bail!("the step runs a host function inside the graph")
            }
            _ => {}
        }
    }
    Ok(())
}
