//! What candle's backward pass issues, counted by walking the graph it keeps
//! (`model::cost::backward_counted`), against a count by hand. Its own test binary: candle
//! reads the variable that keeps the graph once per thread, and a process sets it before its
//! threads read the environment.

use candle_core::{Device, Tensor, Var};
use selfdistill::model::cost::{backward_counted, Cost, KEEP_BACKWARD_GRAPH};

/// `sum(a * b)` over two variables, by hand from candle 0.10's `backward`. `sum_all` is a
/// reduction, then a reshape (the root): ones for the root; zeros for the reduction, the
/// product, `a` and `b`; the root's gradient reshaped and added, then broadcast and added (2);
/// the product's two contributions (`grad * b`, `grad * a`), each added (4): 11 kernels. With
/// a constant `c` in `sum((a * c) * b)`: one more node and `c`'s gradient (zeros for both) and
/// the inner product's two contributions, each added (4): 11 + 2 + 4 = 17.
#[test]
fn candle_backward_counts_what_its_code_issues() {
    std::env::set_var(KEEP_BACKWARD_GRAPH, "1");
    std::thread::spawn(|| {
        let dev = Device::Cpu;
        let a = Var::from_tensor(&Tensor::new(&[1f32, 2., 3.], &dev).unwrap()).unwrap();
        let b = Var::from_tensor(&Tensor::new(&[4f32, 5., 6.], &dev).unwrap()).unwrap();
        let root = (a.as_tensor() * b.as_tensor()).unwrap().sum_all().unwrap();
        let (store, cost) = backward_counted(&root).unwrap();
        assert_eq!(cost, Cost::kernels(11));
        let ga: Vec<f32> = store.get(a.as_tensor()).unwrap().to_vec1().unwrap();
        assert_eq!(ga, [4., 5., 6.]);

        let c = Tensor::new(&[1f32, 1., 2.], &dev).unwrap();
        let ac = (a.as_tensor() * &c).unwrap();
        let root = (ac * b.as_tensor()).unwrap().sum_all().unwrap();
        let (store, cost) = backward_counted(&root).unwrap();
        assert_eq!(cost, Cost::kernels(17));
        let ga: Vec<f32> = store.get(a.as_tensor()).unwrap().to_vec1().unwrap();
        assert_eq!(ga, [4., 5., 12.]);
    })
    .join()
    .unwrap();
}
