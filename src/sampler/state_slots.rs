//! Per-sequence state slots for a model's layers that keep a fixed amount per sequence: the
//! recurrent layers (Qwen3.5's Gated DeltaNet: the conv's last inputs and the recurrent state)
//! and the sliding-window layers (Gemma 3: the ring of the window's keys and values, see
//! `window_ring`). Each running sequence owns one slot, a fixed number of f32 values per such
//! layer whatever its length, next to the KV blocks of its full-attention layers.
//!
//! Unlike blocks, a state cannot be shared copy-on-write: the n samples of a prompt each copy
//! the prompt's state into a slot of their own ([`StateSlots::read`], [`StateSlots::write`]).
//! A sequence preempted by recompute gives its slot back and starts from zeros when it is
//! scheduled again. The slots live where the model runs: on the host for the CPU sampler, in GPU
//! memory for the CUDA sampler (one `[slots][values]` f32 tensor per layer, with one more row:
//! the padding slot of a decode step padded to a CUDA graph's bucket; a step gathers its
//! sequences' rows with one kernel and scatters the new states back with another, and only the
//! free list stays on the host, as vLLM keeps its state slots). Knows nothing of scheduling.

use candle_core::{DType, Device, Tensor};

use crate::model::attention::{PoolStep, RecurrentStep};
use crate::model::cost::Cost;
use crate::model::ModelConfig;
#[cfg(feature = "cuda")]
use crate::sampler::gpu_plan::StepCosts;

#[derive(Debug)]
pub struct StateSlots {
    /// Values per sequence in each model layer (0 for a layer without state).
    values: Vec<usize>,
    /// Each recurrent layer's slots, `slots x values` (empty for other layers), on the host.
    layers: Vec<Vec<f32>>,
    /// The same on a GPU: each layer's `(slots, values)` f32 tensor (none for other layers);
    /// `layers` then stays empty.
    #[cfg(feature = "cuda")]
    device: Option<DeviceSlots>,
    free: Vec<usize>,
    num_slots: usize,
    /// What the step's gathers and scatters issued on a device since the last
    /// [`Self::take_cost`].
    spent: Cost,
}

/// A slot's state saved for the samples that fork from it ([`StateSlots::read`]): values on the
/// host, or one row per layer in GPU memory.
#[derive(Debug)]
pub enum SavedState {
    Host(Vec<f32>),
    #[cfg(feature = "cuda")]
    Device(Vec<Option<Tensor>>),
}

/// The GPU store: per layer the pool tensor, a row of zeros for new slots, and the step's slot
/// ids, in the sampler's step upload ([`StateSlots::set_step_rows`]) or else uploaded once for
/// all its layers.
#[cfg(feature = "cuda")]
#[derive(Debug)]
struct DeviceSlots {
    pools: Vec<Option<Tensor>>,
    zeros: Vec<Option<Tensor>>,
    rows: Option<(Vec<usize>, Tensor)>,
    /// The step's sequence starts for the kernels, likewise (none when each sequence brings
    /// one token).
    starts: Option<(Vec<usize>, Option<Tensor>)>,
    gather: candle_core::cuda_backend::cudarc::driver::CudaFunction,
    scatter: candle_core::cuda_backend::cudarc::driver::CudaFunction,
}

impl StateSlots {
    /// `num_slots` slots for the recurrent layers of `cfg` (none for a model without any).
    pub fn new(cfg: &ModelConfig, num_slots: usize) -> StateSlots {
        let values: Vec<usize> = (0..cfg.num_layers())
            .map(|i| cfg.layer_cache(i).fixed_values())
            .collect();
        let num_slots = if values.iter().any(|&v| v > 0) {
            num_slots
        } else {
            0
        };
        StateSlots {
            layers: values.iter().map(|v| vec![0f32; v * num_slots]).collect(),
            values,
            #[cfg(feature = "cuda")]
            device: None,
            free: (0..num_slots).rev().collect(),
            num_slots,
            spent: Cost::default(),
        }
    }

    /// What the step's gathers and scatters issued on a device since the last take (a GPU's
    /// kernels, the slot ids' upload, or the copies of host slots to and from the device), and
    /// zero from now on.
    pub fn take_cost(&mut self) -> Cost {
        std::mem::take(&mut self.spent)
    }

    /// [`Self::new`] on the model's device: the slots in GPU memory on a CUDA device.
    pub fn new_on(
        cfg: &ModelConfig,
        num_slots: usize,
        device: &Device,
    ) -> candle_core::Result<StateSlots> {
        #[cfg(feature = "cuda")]
        if device.is_cuda() {
            return Self::new_cuda(cfg, num_slots, device);
        }
        let _ = device;
        Ok(Self::new(cfg, num_slots))
    }

    #[cfg(feature = "cuda")]
    fn new_cuda(
        cfg: &ModelConfig,
        num_slots: usize,
        device: &Device,
    ) -> candle_core::Result<StateSlots> {
        use crate::cuda::kernels::{module_fn, STATE_SLOTS_PTX};
        // the host's layers stay empty
        let mut s = Self::new(cfg, 0);
        if num_slots == 0 || s.values.iter().all(|&v| v == 0) {
            return Ok(s); // nothing to keep: no kernels to load
        }
        let tensor = |v: usize, rows: usize| -> candle_core::Result<Option<Tensor>> {
            if v == 0 || rows == 0 {
                return Ok(None);
            }
            Tensor::zeros((rows, v), DType::F32, device).map(Some)
        };
        // one row more than the free list hands out: the padding slot of a decode step padded
        // to a CUDA graph's bucket, whose padded rows update it and nothing else reads
        let pools = s
            .values
            .iter()
            .map(|&v| tensor(v, num_slots + 1))
            .collect::<candle_core::Result<_>>()?;
        let zeros = s
            .values
            .iter()
            .map(|&v| tensor(v, 1))
            .collect::<candle_core::Result<_>>()?;
        let dev = device.as_cuda_device()?;
        let load = |name| module_fn(dev, name, "selfdistill_state_slots", STATE_SLOTS_PTX);
        s.device = Some(DeviceSlots {
            pools,
            zeros,
            rows: None,
            starts: None,
            gather: load("gather_rows_f32")?,
            scatter: load("scatter_rows_f32")?,
        });
        s.free = (0..num_slots).rev().collect();
        s.num_slots = num_slots;
        Ok(s)
    }

    /// The slot a padded row of a step reads and writes (GPU slots only: one row past those
    /// the free list hands out; vLLM's padding slot). `None` on the host.
    pub fn padding_slot(&self) -> Option<usize> {
        #[cfg(feature = "cuda")]
        if self.device.is_some() {
            return Some(self.num_slots);
        }
        None
    }

    /// Whether the model has recurrent layers.
    pub fn is_used(&self) -> bool {
        self.num_slots > 0
    }

    /// Bytes of one sequence's state over all layers.
    pub fn bytes_per_seq(cfg: &ModelConfig) -> usize {
        cfg.state_values_per_seq() * std::mem::size_of::<f32>()
    }

    /// A free slot, zeroed; `None` when all are taken.
    pub fn alloc(&mut self) -> candle_core::Result<Option<usize>> {
        let Some(s) = self.free.pop() else {
            return Ok(None);
        };
        self.zero(s)?;
        Ok(Some(s))
    }

    pub fn release(&mut self, slot: usize) {
        debug_assert!(!self.free.contains(&slot), "slot {slot} released twice");
        self.free.push(slot);
    }

    /// Sets every layer's state of `slot` to zeros (a sequence that starts over).
    pub fn zero(&mut self, slot: usize) -> candle_core::Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(d) = &self.device {
            for (pool, zero) in d.pools.iter().zip(&d.zeros) {
                if let (Some(pool), Some(zero)) = (pool, zero) {
                    pool.slice_set(zero, 0, slot)?;
                }
            }
            return Ok(());
        }
        for (layer, &v) in self.layers.iter_mut().zip(&self.values) {
            layer[slot * v..(slot + 1) * v].fill(0.0);
        }
        Ok(())
    }

    /// `slot`'s state over all layers, kept for [`Self::write`] (on the GPU, a copy of each
    /// layer's row in GPU memory).
    pub fn read(&self, slot: usize) -> candle_core::Result<SavedState> {
        #[cfg(feature = "cuda")]
        if let Some(d) = &self.device {
            // the row alone (candle's `copy` of a narrowed view clones the whole pool)
            let row = |p: &Tensor| -> candle_core::Result<Tensor> {
                let out = Tensor::zeros((1, p.dim(1)?), p.dtype(), p.device())?;
                out.slice_set(&p.narrow(0, slot, 1)?, 0, 0)?;
                Ok(out)
            };
            let rows = d
                .pools
                .iter()
                .map(|p| p.as_ref().map(row).transpose())
                .collect::<candle_core::Result<_>>()?;
            return Ok(SavedState::Device(rows));
        }
        let mut out = Vec::new();
        for (layer, &v) in self.layers.iter().zip(&self.values) {
            out.extend_from_slice(&layer[slot * v..(slot + 1) * v]);
        }
        Ok(SavedState::Host(out))
    }

    /// Sets `slot`'s state from what [`Self::read`] kept.
    pub fn write(&mut self, slot: usize, state: &SavedState) -> candle_core::Result<()> {
        match state {
            SavedState::Host(values) => {
                let mut at = 0;
                for (layer, &v) in self.layers.iter_mut().zip(&self.values) {
                    if v == 0 {
                        continue;
                    }
                    let Some(dst) = layer.get_mut(slot * v..(slot + 1) * v) else {
                        candle_core::bail!("a host state written to the GPU's state slots")
                    };
                    dst.copy_from_slice(&values[at..at + v]);
                    at += v;
                }
                Ok(())
            }
            #[cfg(feature = "cuda")]
            SavedState::Device(rows) => {
                let Some(d) = &self.device else {
                    candle_core::bail!("a GPU state written to the host's state slots")
                };
                for (pool, row) in d.pools.iter().zip(rows) {
                    if let (Some(pool), Some(row)) = (pool, row) {
                        pool.slice_set(row, 0, slot)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Layer `layer`'s states of `slots`, end to end (`slots.len() x values`); `None` for a
    /// layer without state.
    pub fn gather(&self, layer: usize, slots: &[usize]) -> Option<Vec<f32>> {
        let v = *self.values.get(layer).filter(|&&v| v > 0)?;
        let l = &self.layers[layer];
        if slots.iter().any(|&s| (s + 1) * v > l.len()) {
            return None;
        }
        Some(
            slots
                .iter()
                .flat_map(|&s| &l[s * v..(s + 1) * v])
                .copied()
                .collect(),
        )
    }

    /// Layer `layer`'s states of `slots` (distinct), in place, in their order; `None` for a
    /// layer without state or a slot given twice.
    pub fn lend(&mut self, layer: usize, slots: &[usize]) -> Option<Vec<&mut [f32]>> {
        let v = *self.values.get(layer).filter(|&&v| v > 0)?;
        let mut all: Vec<Option<&mut [f32]>> = self.layers[layer].chunks_mut(v).map(Some).collect();
        slots.iter().map(|&s| all.get_mut(s)?.take()).collect()
    }

    /// Writes [`Self::gather`]'s layout back into `slots`.
    pub fn scatter(&mut self, layer: usize, slots: &[usize], states: &[f32]) -> Result<(), String> {
        let v = self.values.get(layer).copied().unwrap_or(0);
        if v == 0 || states.len() != slots.len() * v {
            return Err(format!(
                "layer {layer}: {} state values for {} sequences of {v}",
                states.len(),
                slots.len()
            ));
        }
        let l = &mut self.layers[layer];
        if slots.iter().any(|&s| (s + 1) * v > l.len()) {
            return Err(format!("layer {layer}: a slot outside the host's slots"));
        }
        for (&s, st) in slots.iter().zip(states.chunks(v)) {
            l[s * v..(s + 1) * v].copy_from_slice(st);
        }
        Ok(())
    }

    /// What recurrent layer `layer` needs of a step whose sequences (of `seq_lens` tokens) own
    /// `slots`: their states as a (sequences, `values`) f32 tensor on `device`. The attention
    /// backends of the CPU and the GPU both hand it out.
    pub fn step_state(
        &mut self,
        layer: usize,
        values: usize,
        slots: &[usize],
        seq_lens: &[usize],
        device: &Device,
    ) -> candle_core::Result<RecurrentStep> {
        #[cfg(feature = "cuda")]
        if self.device.is_some() {
            return self.step_state_cuda(layer, values, slots, seq_lens);
        }
        let Some(rows) = self.gather(layer, slots) else {
            candle_core::bail!("layer {layer} has no state slots")
        };
        if rows.len() != slots.len() * values {
            candle_core::bail!("layer {layer}: state slots of another size than {values} values")
        }
        let state = Tensor::from_vec(rows, (slots.len(), values), &Device::Cpu)?;
        if !device.is_cpu() {
            self.spent += Cost::UPLOAD;
        }
        Ok(RecurrentStep {
            seq_lens: seq_lens.to_vec(),
            state: Some(state.to_device(device)?),
        })
    }

    /// Layer `layer`'s pool on the GPU and the step's rows of it (`slots`, whose sequences bring
    /// `seq_lens` tokens), for kernels that update them in place; `None` for slots on the host.
    pub fn pool_step(
        &mut self,
        layer: usize,
        values: usize,
        slots: &[usize],
        seq_lens: &[usize],
    ) -> candle_core::Result<Option<PoolStep>> {
        #[cfg(feature = "cuda")]
        if self.device.is_some() {
            return self
                .pool_step_cuda(layer, values, slots, seq_lens)
                .map(Some);
        }
        let _ = (layer, values, slots, seq_lens);
        Ok(None)
    }

    /// Keeps the states a step's sequences end with (from any device) in their `slots`.
    pub fn store_step_state(
        &mut self,
        layer: usize,
        slots: &[usize],
        state: &Tensor,
    ) -> candle_core::Result<()> {
        #[cfg(feature = "cuda")]
        if self.device.is_some() {
            let state = state.to_dtype(DType::F32)?;
            return self.copy_rows_cuda(layer, slots, &state, false);
        }
        if !state.device().is_cpu() {
            self.spent += Cost::DOWNLOAD;
        }
        let values = state
            .flatten_all()?
            .to_dtype(DType::F32)?
            .to_device(&Device::Cpu)?
            .to_vec1::<f32>()?;
        self.scatter(layer, slots, &values)
            .map_err(candle_core::Error::Msg)
    }
}

#[cfg(feature = "cuda")]
impl StateSlots {
    /// The step's rows of layer `layer`'s pool, gathered on the GPU.
    fn step_state_cuda(
        &mut self,
        layer: usize,
        values: usize,
        slots: &[usize],
        seq_lens: &[usize],
    ) -> candle_core::Result<RecurrentStep> {
        if self.values.get(layer) != Some(&values) {
            candle_core::bail!("layer {layer}: state slots of another size than {values} values")
        }
        let dev = self
            .device
            .as_ref()
            .and_then(|d| d.pools[layer].as_ref())
            .map(|p| p.device().clone());
        let Some(dev) = dev else {
            candle_core::bail!("layer {layer} has no state slots")
        };
        // the gather writes every value: no zeros first (a pass over the states per layer)
        let cuda = dev.as_cuda_device()?;
        // SAFETY: `copy_rows_cuda` below writes all slots.len() x values elements before any
        // read (stream order).
        let buf = unsafe { cuda.alloc::<f32>(slots.len() * values)? };
        let out = Tensor::from_storage(
            candle_core::Storage::Cuda(candle_core::CudaStorage::wrap_cuda_slice(
                buf,
                cuda.clone(),
            )),
            (slots.len(), values),
            candle_core::op::BackpropOp::none(),
            false,
        );
        // the buffer and the gather's kernel (the ids' upload, where the step's did not bring
        // them: `step_ids`)
        self.spent += StepCosts::STATE_GATHER;
        self.copy_rows_cuda(layer, slots, &out, true)?;
        Ok(RecurrentStep {
            seq_lens: seq_lens.to_vec(),
            state: Some(out),
        })
    }

    fn pool_step_cuda(
        &mut self,
        layer: usize,
        values: usize,
        slots: &[usize],
        seq_lens: &[usize],
    ) -> candle_core::Result<PoolStep> {
        if self.values.get(layer) != Some(&values) {
            candle_core::bail!("layer {layer}: state slots of another size than {values} values")
        }
        if slots.len() != seq_lens.len() {
            candle_core::bail!(
                "layer {layer}: {} slots for {} sequences",
                slots.len(),
                seq_lens.len()
            )
        }
        let Some(pool) = self.device.as_ref().and_then(|d| d.pools[layer].clone()) else {
            candle_core::bail!("layer {layer} has no state slots")
        };
        let ids = self.step_ids(slots, pool.device())?;
        let d = self.device.as_mut().expect("checked above");
        if d.starts.as_ref().is_none_or(|(l, _)| l != seq_lens) {
            let starts = crate::model::attention::seq_starts(seq_lens)
                .map(|s| Tensor::new(s.as_slice(), pool.device()))
                .transpose()?;
            if starts.is_some() {
                self.spent += Cost::UPLOAD;
            }
            d.starts = Some((seq_lens.to_vec(), starts));
        }
        let starts = d.starts.as_ref().and_then(|(_, s)| s.clone());
        Ok(PoolStep {
            seq_lens: seq_lens.to_vec(),
            pool,
            ids,
            starts,
        })
    }

    /// Hands the step's slot ids (u32) and sequence starts (none when each of its sequences,
    /// of `seq_lens` tokens, brings one) already on the device, in the step's one upload: its
    /// layers then upload nothing. Ignored for slots on the host.
    pub fn set_step_rows(
        &mut self,
        slots: &[usize],
        ids: Tensor,
        seq_lens: &[usize],
        starts: Option<Tensor>,
    ) -> candle_core::Result<()> {
        let Some(d) = self.device.as_mut() else {
            return Ok(());
        };
        if ids.dims1()? != slots.len() {
            candle_core::bail!("{} slot ids for {} slots", ids.dims1()?, slots.len())
        }
        d.rows = Some((slots.to_vec(), ids));
        d.starts = Some((seq_lens.to_vec(), starts));
        Ok(())
    }

    /// Bytes [`Self::save_step_rows`] keeps for `n` rows.
    pub fn step_rows_bytes(&self, n: usize) -> u64 {
        (n * self.values.iter().sum::<usize>() * std::mem::size_of::<f32>()) as u64
    }

    /// Each recurrent layer's states of the first `n` of the step's rows ([`Self::set_step_rows`]),
    /// copied out of the pools (one gather a layer, by the step's ids): what
    /// [`Self::restore_step_rows`] puts back. Empty for slots on the host.
    pub fn save_step_rows(&self, n: usize) -> candle_core::Result<Vec<Option<Tensor>>> {
        let Some(d) = self.device.as_ref() else {
            return Ok(Vec::new());
        };
        let Some((_, ids)) = d.rows.as_ref() else {
            candle_core::bail!("no step rows to save")
        };
        let ids = ids.narrow(0, 0, n)?;
        d.pools
            .iter()
            .map(|p| {
                p.as_ref()
                    .map(|p| -> candle_core::Result<Tensor> {
                        let out = Tensor::zeros((n, p.dim(1)?), DType::F32, p.device())?;
                        launch_rows(&d.gather, p, &out, &ids, true)?;
                        Ok(out)
                    })
                    .transpose()
            })
            .collect()
    }

    /// Puts back what [`Self::save_step_rows`] kept (one scatter a layer).
    pub fn restore_step_rows(&mut self, saved: &[Option<Tensor>]) -> candle_core::Result<()> {
        let Some(d) = self.device.as_ref() else {
            return Ok(());
        };
        let Some((_, ids)) = d.rows.as_ref() else {
            candle_core::bail!("no step rows to restore")
        };
        for (p, rows) in d.pools.iter().zip(saved) {
            if let (Some(p), Some(rows)) = (p, rows) {
                let ids = ids.narrow(0, 0, rows.dim(0)?)?;
                launch_rows(&d.scatter, p, rows, &ids, false)?;
            }
        }
        Ok(())
    }

    /// Forgets the rows [`Self::set_step_rows`] handed over, once their step is done: they are
    /// views of the step's upload, which the next step rewrites.
    pub fn forget_step_rows(&mut self) {
        if let Some(d) = self.device.as_mut() {
            d.rows = None;
            d.starts = None;
        }
    }

    /// The step's slot ids on the device (u32): those the step's upload brought, or else
    /// uploaded once for all its layers.
    fn step_ids(&mut self, slots: &[usize], device: &Device) -> candle_core::Result<Tensor> {
        let Some(d) = self.device.as_mut() else {
            candle_core::bail!("no GPU state slots")
        };
        if d.rows.as_ref().is_none_or(|(s, _)| s != slots) {
            let ids: Vec<u32> = slots.iter().map(|&s| s as u32).collect();
            d.rows = Some((slots.to_vec(), Tensor::new(ids.as_slice(), device)?));
            self.spent += Cost::UPLOAD;
        }
        Ok(d.rows.as_ref().expect("set above").1.clone())
    }

    /// One launch: `rows` (slots.len(), values) f32 from layer `layer`'s pool rows `slots`
    /// (`gather`), or into them.
    fn copy_rows_cuda(
        &mut self,
        layer: usize,
        slots: &[usize],
        rows: &Tensor,
        gather: bool,
    ) -> candle_core::Result<()> {
        let v = self.values.get(layer).copied().unwrap_or(0);
        let Some(d) = self.device.as_ref() else {
            candle_core::bail!("no GPU state slots")
        };
        let Some(pool) = d.pools.get(layer).and_then(|p| p.as_ref()) else {
            candle_core::bail!("layer {layer} has no state slots")
        };
        if rows.dims() != [slots.len(), v] || rows.dtype() != DType::F32 {
            candle_core::bail!(
                "layer {layer}: states {:?} {:?} for {} sequences of {v} f32 values",
                rows.dims(),
                rows.dtype(),
                slots.len()
            )
        }
        if slots.is_empty() {
            return Ok(());
        }
        let pool = pool.clone();
        // the step's slot ids go up once for all its layers
        let ids = &self.step_ids(slots, pool.device())?;
        let d = self.device.as_ref().expect("checked above");
        if gather && !rows.is_contiguous() {
            candle_core::bail!("layer {layer}: the rows a gather writes must be contiguous")
        }
        if !gather {
            self.spent +=
                StepCosts::STATE_SCATTER + Cost::kernels(u64::from(!rows.is_contiguous()));
        }
        let rows = rows.contiguous()?;
        let f = if gather { &d.gather } else { &d.scatter };
        launch_rows(f, &pool, &rows, ids, gather)
    }
}

/// One launch of `f` (`gather_rows_f32` when `gather`, else `scatter_rows_f32`): the contiguous
/// (ids, values) f32 `rows` from `pool`'s rows `ids` (u32 on the device), or into them.
#[cfg(feature = "cuda")]
fn launch_rows(
    f: &candle_core::cuda_backend::cudarc::driver::CudaFunction,
    pool: &Tensor,
    rows: &Tensor,
    ids: &Tensor,
    gather: bool,
) -> candle_core::Result<()> {
    use crate::cuda::kernels::{checked, tensor_ptr};
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    let (n, v) = rows.dims2()?;
    if pool.dim(1)? != v || ids.dims1()? != n || ids.dtype() != DType::U32 {
        candle_core::bail!(
            "state rows {:?} for a pool {:?} by ids {:?}",
            rows.dims(),
            pool.dims(),
            ids.dims()
        )
    }
    if n == 0 {
        return Ok(());
    }
    let (pool_p, rows_p, ids_p) = (tensor_ptr(pool)?, tensor_ptr(rows)?, tensor_ptr(ids)?);
    let cuda = pool.device().as_cuda_device()?;
    let stream = cuda.cuda_stream();
    let mut b = stream.launch_builder(f);
    let values = v as i64;
    if gather {
        b.arg(&rows_p).arg(&pool_p);
    } else {
        b.arg(&pool_p).arg(&rows_p);
    }
    b.arg(&ids_p).arg(&values);
    let chunks = (v / 4).div_ceil(256).clamp(1, 64) as u32;
    let cfg = LaunchConfig {
        grid_dim: (n as u32, chunks, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `gather_rows_f32` / `scatter_rows_f32` in
    // kernels/state_slots.cu; every slot id is below the pool's rows (the free list hands out no
    // other, and the padding slot is its last row), `rows` holds n x values, and the tensors
    // outlive the launch (stream order). The ids are the u32 bit patterns the kernel reads as
    // int.
    checked(unsafe { b.launch(cfg) })
}

/// A step's state slots as an attention backend holds them: the slots and each scheduled
/// sequence's slot; `None` for a step given none (a model without recurrent layers).
pub type StepSlots<'a> = Option<(&'a mut StateSlots, Vec<usize>)>;

/// The slots of a step for recurrent layer `layer`, or the error of a step given none: what
/// every attention backend's recurrent methods start with.
pub fn step_slots<'s>(
    s: &'s mut StepSlots<'_>,
    layer: usize,
) -> candle_core::Result<(&'s mut StateSlots, &'s [usize])> {
    match s {
        Some((states, slots)) => Ok((&mut **states, slots.as_slice())),
        None => {
            candle_core::bail!("layer {layer} is recurrent, and this step was given no state slots")
        }
    }
}
