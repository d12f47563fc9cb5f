//! What an operation spent on its device ([`Cost`]): kernel launches, device allocations,
//! copies each way and synchronisations, as the operation declares them; and what candle's
//! recorded graph says an operation allocated ([`graph_cost`]), which the tests hold the
//! declarations to. Knows nothing of layers or devices.

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
