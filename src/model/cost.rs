//! What an operation spent on its device ([`Cost`]): kernel launches, device allocations,
//! copies each way and synchronisations, as the operation declares them; and what candle's
//! recorded graph says an operation allocated ([`graph_cost`]), which the tests hold the
//! declarations to, and what candle's backward pass issues ([`backward_counted`]). Knows nothing
//! of layers or devices.

use std::ops::AddAssign;

/// What a call spent on its device, as its implementation declares it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Cost {
    /// Kernels launched (on the CPU: candle operations that compute, the same count a GPU
    /// launches for the same candle code).
    pub launches: u64,
    /// Device buffers allocated.
    pub allocations: u64,
    pub host_to_device: u64,
    pub device_to_host: u64,
    /// Waits for the device.
    pub syncs: u64,
}

impl Cost {
    /// `n` candle operations that each compute into a new buffer.
    pub const fn kernels(n: u64) -> Cost {
        Cost {
            launches: n,
            allocations: n,
            host_to_device: 0,
            device_to_host: 0,
            syncs: 0,
        }
    }

    /// `n` kernels that write into buffers they were given (`slice_set`): no allocation.
    pub const fn in_place(n: u64) -> Cost {
        Cost {
            launches: n,
            allocations: 0,
            host_to_device: 0,
            device_to_host: 0,
            syncs: 0,
        }
    }

    /// An upload of host values into a new device buffer.
    pub const UPLOAD: Cost = Cost {
        launches: 0,
        allocations: 1,
        host_to_device: 1,
        device_to_host: 0,
        syncs: 0,
    };

    /// A download to the host, which waits for the device.
    pub const DOWNLOAD: Cost = Cost {
        launches: 0,
        allocations: 0,
        host_to_device: 0,
        device_to_host: 1,
        syncs: 1,
    };
}

/// Whether a run counts its costs, and for which device: the costs that need work of their own
/// to find (a graph walked, a GPU's path told apart) are found only when counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountMode {
    /// Not counting: no work spent on counts beyond adding declared numbers.
    Off,
    /// Counting what this device runs.
    On,
    /// Counting a GPU's step on a machine without one: where a GPU would run our kernels
    /// instead of candle ops (the Gated DeltaNet decode step), their cost is declared and their
    /// outputs are zeros. For counts only, never for values.
    AsCuda,
}

impl AddAssign for Cost {
    fn add_assign(&mut self, o: Cost) {
        self.launches += o.launches;
        self.allocations += o.allocations;
        self.host_to_device += o.host_to_device;
        self.device_to_host += o.device_to_host;
        self.syncs += o.syncs;
    }
}

impl std::ops::Add for Cost {
    type Output = Cost;
    fn add(mut self, o: Cost) -> Cost {
        self += o;
        self
    }
}

impl std::ops::Mul<u64> for Cost {
    type Output = Cost;
    fn mul(self, n: u64) -> Cost {
        Cost {
            launches: self.launches * n,
            allocations: self.allocations * n,
            host_to_device: self.host_to_device * n,
            device_to_host: self.device_to_host * n,
            syncs: self.syncs * n,
        }
    }
}

/// The buffers of the graph candle recorded from variables to `outputs`: one per operation that
/// computed into a new buffer (a view shares its source's buffer, a variable is an input). A
/// join of several parts launches a copy per part; it counts once here.
pub fn graph_cost(outputs: &[&candle_core::Tensor]) -> Cost {
    use std::collections::HashSet;
    let (mut made, mut inputs) = (HashSet::new(), HashSet::new());
    for o in outputs {
        for n in o.sorted_nodes() {
            let (storage, _) = n.storage_and_layout();
            let at = &*storage as *const candle_core::Storage as usize;
            if n.is_variable() {
                inputs.insert(at);
            } else {
                made.insert(at);
            }
        }
    }
    Cost::kernels(made.difference(&inputs).count() as u64)
}

/// The distinct buffers behind `nodes`: (made by an operation, variables').
fn storages<'a>(
    nodes: impl IntoIterator<Item = &'a candle_core::Tensor>,
) -> (
    std::collections::HashSet<usize>,
    std::collections::HashSet<usize>,
) {
    let (mut made, mut vars) = (
        std::collections::HashSet::new(),
        std::collections::HashSet::new(),
    );
    for n in nodes {
        let (storage, _) = n.storage_and_layout();
        let at = &*storage as *const candle_core::Storage as usize;
        if n.is_variable() {
            vars.insert(at);
        } else {
            made.insert(at);
        }
    }
    (made, vars)
}

/// Whether this thread's backward passes keep the graph of the gradients they compute, which
/// [`backward_counted`] reads: candle reads `CANDLE_GRAD_DO_NOT_DETACH` once per thread, at the
/// thread's first backward pass, so a process that counts sets it before starting the thread
/// that counts.
pub const KEEP_BACKWARD_GRAPH: &str = "CANDLE_GRAD_DO_NOT_DETACH";

/// `root.backward()`, with what candle's backward pass issued. Needs [`KEEP_BACKWARD_GRAPH`]
/// (an error otherwise: the count would silently be zero).
///
/// Read off candle 0.10's `backward` (`backprop.rs`): every node of the forward graph, and every
/// untracked input of one (a constant, whose gradient is computed and never used), gets a
/// gradient buffer, zeros from `or_insert` (ones for the root): one kernel each. Each
/// contribution is then added to it, and each op's backward computes its contributions: kernels
/// that, with the graph kept, are the buffers reachable from the variables' gradients that the
/// forward did not make. What the graph cannot see is added by hand: the root's own
/// contributions before any tracked tensor takes part (`root` is a `sum_all`, a reduction then
/// a reshape: the ones reshaped and added, then broadcast and added: 2 kernels).
/// A custom op's backward computes with no graph; its caller declares it.
///
/// A lower bound where a gradient has no graph: from the root until it first meets a variable,
/// and from a custom op's backward until the next op that takes a tracked tensor (a gradient
/// leaving the block attention goes through the RoPE's products with constant tables before
/// the q/k norms' weights). Exact otherwise, as the tests count by hand; the trainer seeds each
/// layer's backward with a variable for that reason.
pub fn backward_counted(
    root: &candle_core::Tensor,
) -> candle_core::Result<(candle_core::backprop::GradStore, Cost)> {
    let nodes = root.sorted_nodes();
    let ids: std::collections::HashSet<_> = nodes.iter().map(|n| n.id()).collect();
    let (forward, _) = storages(nodes.iter().copied());
    drop(nodes);
    let store = root.backward()?;
    let grads: Vec<&candle_core::Tensor> =
        store.get_ids().filter_map(|id| store.get_id(*id)).collect();
    // untracked inputs (constants) get gradients too, which stay in the store
    let constants = store.get_ids().filter(|id| !ids.contains(id)).count();
    let buffers = (ids.len() + constants) as u64;
    if !grads.iter().any(|g| g.track_op() && !g.is_variable()) && ids.len() > 1 {
        candle_core::bail!(
            "the backward pass kept no graph to count: set {KEEP_BACKWARD_GRAPH}=1 before the \
             counting thread's first backward pass"
        )
    }
    // One walk over all the gradients (a walk per gradient would be quadratic in the graph):
    // joined per dtype into a tensor of our own, whose buffers are not the backward's.
    let mut ours = std::collections::HashSet::new();
    let mut at = |t: &candle_core::Tensor| {
        let (storage, _) = t.storage_and_layout();
        ours.insert(&*storage as *const candle_core::Storage as usize);
    };
    let mut joined = Vec::new();
    let mut dtypes: Vec<candle_core::DType> = grads.iter().map(|g| g.dtype()).collect();
    dtypes.sort_by_key(|d| d.as_str());
    dtypes.dedup();
    for dtype in dtypes {
        let mut flat = Vec::new();
        for g in grads.iter().filter(|g| g.dtype() == dtype && g.track_op()) {
            let f = g.flatten_all()?;
            if !g.is_contiguous() {
                at(&f);
            }
            flat.push(f);
        }
        if !flat.is_empty() {
            let j = candle_core::Tensor::cat(&flat, 0)?;
            if flat.len() > 1 {
                at(&j);
            }
            joined.push(j);
        }
    }
    let (made, vars) = storages(joined.iter().flat_map(|j| j.sorted_nodes()));
    let computed = made
        .iter()
        .filter(|s| !forward.contains(s) && !vars.contains(s) && !ours.contains(s))
        .count() as u64;
    Ok((store, Cost::kernels(buffers + 2 + computed)))
}
