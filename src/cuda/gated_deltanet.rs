//! Launchers for `kernels/gated_deltanet.cu`: a Gated DeltaNet layer's sampling step (a decode
//! step's one token per sequence, or a prompt's tokens) as two kernels, one per layer op, each
//! looping over a sequence's tokens: the conv update with SiLU ([`conv_step`]), then gating,
//! l2norm, the delta rule and the gated RMSNorm ([`recurrent_step`]). Each reads and writes a
//! sequence's state once, in place: in a pool of state slots (the sampler's) through the step's
//! slot ids, or in the step's own rows. Knows the kernels' layouts and which shapes they take,
//! not the model: the candle layer ops (`model::layer_ops::candle_deltanet`) hold the maths'
//! reference and decide when to call this.

use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::op::BackpropOp;
use candle_core::{bail, CudaStorage, DType, Result, Storage, Tensor};

use super::kernels::{checked, module_fn, rows_ptr, tensor_ptr, GATED_DELTANET_PTX};
pub use super::shapes::GdnShape;

/// A step's sequences: where their states are, and which tokens each brings.
pub struct GdnStep<'a> {
    /// (rows, values) f32, each row the conv's last K-1 inputs then the heads' recurrent
    /// states: a pool of state slots, or the step's own rows; updated in place.
    pub states: &'a Tensor,
    /// (S) u32 on the device: sequence s's row of `states`; `None`: row s.
    pub ids: Option<&'a Tensor>,
    /// (S + 1) u32 on the device: sequence s brings tokens `starts[s]..starts[s + 1]`, from 0
    /// to the step's T; `None`: one token each (a decode step).
    pub starts: Option<&'a Tensor>,
    /// S.
    pub seqs: usize,
}

/// The inputs of the recurrent kernel besides the step: the conv's output `u` (T, conv_dim)
/// f32 ([`conv_step`]); the projections `a`, `b` (T, nv) and the gate `z` (T, nv dv), each a
/// matrix or a view of some columns of one (a stacked projection's output); the weights `a_log`,
/// `dt_bias` (nv), `norm_w` (dv); all but `u` in the model's dtype (f32 or bf16).
pub struct GdnRecurrent<'a> {
    pub u: &'a Tensor,
    pub a: &'a Tensor,
    pub b: &'a Tensor,
    pub z: &'a Tensor,
    pub a_log: &'a Tensor,
    pub dt_bias: &'a Tensor,
    pub norm_w: &'a Tensor,
}

/// The kernels' name for the model's dtype.
fn dtype_name(dt: DType) -> Result<&'static str> {
    Ok(match dt {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        other => bail!("gated deltanet kernels: {other:?} (f32 or bf16)"),
    })
}

/// Checks the step against the shape for `tokens` tokens; the three device addresses (states,
/// ids, starts; 0 for none).
fn check_step(shape: &GdnShape, tokens: usize, st: &GdnStep) -> Result<[u64; 3]> {
    if !shape.supported() {
        bail!("gated deltanet kernels: shape {shape:?} not supported");
    }
    let conv_len = (shape.conv_kernel - 1) * shape.conv_dim();
    let values = conv_len + shape.nv * shape.dk * shape.dv;
    let (rows, v) = st.states.dims2()?;
    if v != values || st.states.dtype() != DType::F32 {
        bail!(
            "gated deltanet kernels: states {:?} {:?} do not match {shape:?}",
            st.states.dims(),
            st.states.dtype()
        );
    }
    let index = |t: Option<&Tensor>, len: usize, what: &str| -> Result<u64> {
        match t {
            None => Ok(0),
            Some(t) if t.dims() == [len] && t.dtype() == DType::U32 => tensor_ptr(t),
            Some(t) => bail!(
                "gated deltanet kernels: {what} {:?} {:?}, not {len} u32",
                t.dims(),
                t.dtype()
            ),
        }
    };
    let ids = index(st.ids, st.seqs, "slot ids")?;
    let starts = index(st.starts, st.seqs + 1, "sequence starts")?;
    if st.ids.is_none() && rows != st.seqs {
        bail!(
            "gated deltanet kernels: {rows} state rows for {} sequences",
            st.seqs
        );
    }
    if st.starts.is_none() && tokens != st.seqs {
        bail!(
            "gated deltanet kernels: {tokens} tokens for {} sequences of one token",
            st.seqs
        );
    }
    Ok([tensor_ptr(st.states)?, ids, starts])
}

/// `t` in the kernels' dtype `dt`, as rows they can read: itself when it already is (a view of
/// a wider matrix included), else a contiguous copy.
fn rows_of(t: &Tensor, dt: DType) -> Result<Tensor> {
    if t.dtype() == dt && t.rank() == 2 && (t.dim(1)? <= 1 || t.stride()[1] == 1) {
        return Ok(t.clone());
    }
    t.to_dtype(dt)?.contiguous()
}

/// A new (rows, cols) buffer of `dt` on `state`'s device, for a kernel to write every element
/// of.
fn output(state: &Tensor, rows: usize, cols: usize, dt: DType) -> Result<Tensor> {
    let Storage::Cuda(cs) = &*state.storage_and_layout().0 else {
        bail!("gated deltanet kernels: the state is not on a CUDA device")
    };
    let dev = cs.device.clone();
    // SAFETY: each caller's kernel writes every element before anything reads it.
    let storage = match dt {
        DType::F32 => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<f32>(rows * cols)? }, dev),
        _ => CudaStorage::wrap_cuda_slice(unsafe { dev.alloc::<half::bf16>(rows * cols)? }, dev),
    };
    Ok(Tensor::from_storage(
        Storage::Cuda(storage),
        (rows, cols),
        BackpropOp::none(),
        false,
    ))
}

/// The conv update of a step: `qkv` (T, conv_dim) and the conv's weights `conv_w`
/// (conv_dim, K) in the model's dtype; returns SiLU of the conv (T, conv_dim) f32 and moves the
/// conv inputs of each sequence's state on in place.
pub fn conv_step(shape: &GdnShape, qkv: &Tensor, conv_w: &Tensor, st: &GdnStep) -> Result<Tensor> {
    let (tokens, c) = qkv.dims2()?;
    let dt = qkv.dtype();
    let name = dtype_name(dt)?;
    let [state_p, ids_p, starts_p] = check_step(shape, tokens, st)?;
    if c != shape.conv_dim() {
        bail!(
            "gated deltanet kernels: qkv {:?} does not match {shape:?}",
            qkv.dims()
        );
    }
    if st.seqs == 0 {
        return Tensor::zeros((tokens, c), DType::F32, st.states.device());
    }
    let (qkv, conv_w) = (rows_of(qkv, dt)?, conv_w.to_dtype(dt)?.contiguous()?);
    let u = output(st.states, tokens, c, DType::F32)?;
    let Storage::Cuda(cs) = &*st.states.storage_and_layout().0 else {
        bail!("gated deltanet kernels: the states are not on a CUDA device")
    };
    let dev = cs.device.clone();
    let stream = dev.cuda_stream();
    let ((qkv_p, ld_qkv), conv_p, u_p) = (rows_ptr(&qkv)?, tensor_ptr(&conv_w)?, tensor_ptr(&u)?);
    let k = shape.conv_kernel;
    let (seqs_i, c_i, k_i) = (st.seqs as i32, c as i32, k as i32);
    let values_i = st.states.dim(1)? as i64;
    let conv = module_fn(
        &dev,
        &format!("gdn_conv_{name}"),
        "selfdistill_gated_deltanet",
        GATED_DELTANET_PTX,
    )?;
    let mut l = stream.launch_builder(&conv);
    l.arg(&qkv_p)
        .arg(&ld_qkv)
        .arg(&state_p)
        .arg(&ids_p)
        .arg(&starts_p)
        .arg(&conv_p)
        .arg(&u_p)
        .arg(&seqs_i)
        .arg(&c_i)
        .arg(&k_i)
        .arg(&values_i);
    let n = st.seqs * c;
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 8192) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match the kernel's parameters in kernels/gated_deltanet.cu
    // (pointers as u64, int as i32, int64_t as i64; a null index as 0), the shapes were checked
    // above, the slot ids are rows of the pool (the free list hands out no other) and distinct
    // but for a graph's padded rows, which all share the padding slot (their races touch that
    // row alone, which no real row reads), the starts ascend to `tokens`, and every tensor
    // outlives the launch (stream order).
    checked(unsafe { l.launch(cfg) })?;
    Ok(u)
}

/// Gating, l2norm, the delta rule and the gated RMSNorm of a step; returns the gated norm's
/// output (T, nv dv) in the model's dtype, for the layer's out projection.
pub fn recurrent_step(shape: &GdnShape, x: &GdnRecurrent, st: &GdnStep) -> Result<Tensor> {
    let (tokens, c) = x.u.dims2()?;
    let dt = x.z.dtype();
    let name = dtype_name(dt)?;
    let [state_p, ids_p, starts_p] = check_step(shape, tokens, st)?;
    if c != shape.conv_dim() || x.u.dtype() != DType::F32 || !x.u.is_contiguous() {
        bail!(
            "gated deltanet kernels: u {:?} {:?} does not match {shape:?}",
            x.u.dims(),
            x.u.dtype()
        );
    }
    let (a, b, z) = (rows_of(x.a, dt)?, rows_of(x.b, dt)?, rows_of(x.z, dt)?);
    for (t, cols) in [(&a, shape.nv), (&b, shape.nv), (&z, shape.nv * shape.dv)] {
        if t.dims() != [tokens, cols] {
            bail!(
                "gated deltanet kernels: a projection {:?}, not ({tokens}, {cols})",
                t.dims()
            );
        }
    }
    if st.seqs == 0 {
        return Tensor::zeros((tokens, shape.nv * shape.dv), dt, st.states.device());
    }
    let prep = |t: &Tensor| t.to_dtype(dt)?.contiguous();
    let (a_log, dt_bias, norm_w) = (prep(x.a_log)?, prep(x.dt_bias)?, prep(x.norm_w)?);
    let y = output(st.states, tokens, shape.nv * shape.dv, dt)?;
    let Storage::Cuda(cs) = &*st.states.storage_and_layout().0 else {
        bail!("gated deltanet kernels: the states are not on a CUDA device")
    };
    let dev = cs.device.clone();
    let stream = dev.cuda_stream();
    let rec = module_fn(
        &dev,
        &format!("gdn_recurrent_{name}_dk{}", shape.dk),
        "selfdistill_gated_deltanet",
        GATED_DELTANET_PTX,
    )?;
    let ((a_p, ld_a), (b_p, ld_b), (z_p, ld_z)) = (rows_ptr(&a)?, rows_ptr(&b)?, rows_ptr(&z)?);
    let weights = [
        tensor_ptr(&a_log)?,
        tensor_ptr(&dt_bias)?,
        tensor_ptr(&norm_w)?,
    ];
    let (u_p, y_p) = (tensor_ptr(x.u)?, tensor_ptr(&y)?);
    let (nk_i, nv_i, dv_i, c_i) = (shape.nk as i32, shape.nv as i32, shape.dv as i32, c as i32);
    let conv_len = (shape.conv_kernel - 1) * c;
    let (values_i, conv_len_i, eps) = (st.states.dim(1)? as i64, conv_len as i64, shape.eps as f32);
    let mut l = stream.launch_builder(&rec);
    l.arg(&u_p)
        .arg(&a_p)
        .arg(&ld_a)
        .arg(&b_p)
        .arg(&ld_b)
        .arg(&z_p)
        .arg(&ld_z);
    for p in &weights {
        l.arg(p);
    }
    l.arg(&state_p)
        .arg(&ids_p)
        .arg(&starts_p)
        .arg(&y_p)
        .arg(&nk_i)
        .arg(&nv_i)
        .arg(&dv_i)
        .arg(&c_i)
        .arg(&values_i)
        .arg(&conv_len_i)
        .arg(&eps);
    let threads = shape.dv * shape.parts();
    let cfg = LaunchConfig {
        grid_dim: (st.seqs as u32, shape.nv as u32, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: (4 * (2 * shape.dk + shape.parts() * shape.dv + threads)) as u32,
    };
    // SAFETY: the arguments match the kernel's parameters in kernels/gated_deltanet.cu
    // (pointers as u64, int as i32, int64_t as i64, float as f32; a null index as 0), the
    // shapes were checked above, the slot ids are distinct rows of the pool (but for a graph's
    // padded rows, which share the padding slot: their races touch that row alone), the starts
    // ascend to `tokens`, and every tensor outlives the launch (stream order).
    checked(unsafe { l.launch(cfg) })?;
    Ok(y)
}
