//! Per-sequence state slots for a model's layers that keep a fixed amount per sequence: the
//! recurrent layers (Qwen3.5's Gated DeltaNet: the conv's last inputs and the recurrent state)
//! and the sliding-window layers (Gemma 3: the ring of the window's keys and values, see
//! `window_ring`). Each running sequence owns one slot, a fixed number of f32 values per such
//! layer whatever its length, next to the KV blocks of its full-attention layers.
//!
//! Unlike blocks, a state cannot be shared copy-on-write: the n samples of a prompt each copy
//! the prompt's state into a slot of their own ([`StateSlots::read`], [`StateSlots::write`]).
//! A sequence preempted by recompute gives its slot back and starts from zeros when it is
//! scheduled again. The slots live on the host; a step's states cross to the model's device and
//! back (a device-resident store with a decode kernel is the GPU work still to come). Knows
//! nothing of scheduling.

use candle_core::{DType, Device, Tensor};

use crate::model::attention::RecurrentStep;
use crate::model::ModelConfig;

#[derive(Debug)]
pub struct StateSlots {
    /// Values per sequence in each model layer (0 for a layer without state).
    values: Vec<usize>,
    /// Each recurrent layer's slots, `slots x values` (empty for other layers).
    layers: Vec<Vec<f32>>,
    free: Vec<usize>,
    num_slots: usize,
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
            free: (0..num_slots).rev().collect(),
            num_slots,
        }
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
    pub fn alloc(&mut self) -> Option<usize> {
        let s = self.free.pop()?;
        self.zero(s);
        Some(s)
    }

    pub fn release(&mut self, slot: usize) {
        debug_assert!(!self.free.contains(&slot), "slot {slot} released twice");
        self.free.push(slot);
    }

    /// Sets every layer's state of `slot` to zeros (a sequence that starts over).
    pub fn zero(&mut self, slot: usize) {
        for (layer, &v) in self.layers.iter_mut().zip(&self.values) {
            layer[slot * v..(slot + 1) * v].fill(0.0);
        }
    }

    /// `slot`'s state over all layers, end to end.
    pub fn read(&self, slot: usize) -> Vec<f32> {
        let mut out = Vec::new();
        for (layer, &v) in self.layers.iter().zip(&self.values) {
            out.extend_from_slice(&layer[slot * v..(slot + 1) * v]);
        }
        out
    }

    /// Sets `slot`'s state from [`Self::read`]'s layout.
    pub fn write(&mut self, slot: usize, state: &[f32]) {
        let mut at = 0;
        for (layer, &v) in self.layers.iter_mut().zip(&self.values) {
            layer[slot * v..(slot + 1) * v].copy_from_slice(&state[at..at + v]);
            at += v;
        }
    }

    /// Layer `layer`'s states of `slots`, end to end (`slots.len() x values`); `None` for a
    /// layer without state.
    pub fn gather(&self, layer: usize, slots: &[usize]) -> Option<Vec<f32>> {
        let v = *self.values.get(layer).filter(|&&v| v > 0)?;
        let l = &self.layers[layer];
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
        for (&s, st) in slots.iter().zip(states.chunks(v)) {
            l[s * v..(s + 1) * v].copy_from_slice(st);
        }
        Ok(())
    }

    /// What recurrent layer `layer` needs of a step whose sequences (of `seq_lens` tokens) own
    /// `slots`: their states as a (sequences, `values`) f32 tensor on `device`. The attention
    /// backends of the CPU and the GPU both hand it out.
    pub fn step_state(
        &self,
        layer: usize,
        values: usize,
        slots: &[usize],
        seq_lens: &[usize],
        device: &Device,
    ) -> candle_core::Result<RecurrentStep> {
        let Some(rows) = self.gather(layer, slots) else {
            candle_core::bail!("layer {layer} has no state slots")
        };
        if rows.len() != slots.len() * values {
            candle_core::bail!("layer {layer}: state slots of another size than {values} values")
        }
        let state = Tensor::from_vec(rows, (slots.len(), values), &Device::Cpu)?;
        Ok(RecurrentStep {
            seq_lens: seq_lens.to_vec(),
            state: Some(state.to_device(device)?),
        })
    }

    /// Keeps the states a step's sequences end with (from any device) in their `slots`.
    pub fn store_step_state(
        &mut self,
        layer: usize,
        slots: &[usize],
        state: &Tensor,
    ) -> candle_core::Result<()> {
        let values = state
            .flatten_all()?
            .to_dtype(DType::F32)?
            .to_device(&Device::Cpu)?
            .to_vec1::<f32>()?;
        self.scatter(layer, slots, &values)
            .map_err(candle_core::Error::Msg)
    }
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
