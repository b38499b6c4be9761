//! Partial gradients summed on the device (`ops::sum`): values whose f32 sum one term at a
//! time loses the small parts come out as the exact sum rounded once, and mismatched
//! tensors are refused with nothing written.

use runtime::ops::sum::{Sum, SumArgs};
use runtime::{BlockOn, Gpu, Scalar, Tensor, kernels};

fn gpu() -> Gpu {
    Gpu::new(kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn wait(gpu: &Gpu) {
    gpu.device
        .poll(wgpu::PollType::wait_indefinitely())
        .unwrap();
}

#[test]
fn parts_add_into_the_target_as_their_exact_sum_rounded_once() {
    let gpu = gpu();
    let len = 1000usize;
    // Per element: 1, then three parts 1e8, 1, -1e8: one term at a time in f32 gives 0
    // (1 + 1e8 rounds the 1 away, and so does the next); the exact sum is 2.
    let into: Vec<f32> = (0..len).map(|i| 1.0 + i as f32).collect();
    let parts: Vec<f32> = [1e8f32, 1.0, -1e8]
        .iter()
        .flat_map(|x| std::iter::repeat_n(*x, len))
        .collect();
    let f = Scalar::F32;
    let target = Tensor::from_f32(&gpu, &[2, len as u32 / 2], f, &into).unwrap();
    let stacked = Tensor::from_f32(&gpu, &[3, 2, len as u32 / 2], f, &parts).unwrap();
    let mut sum = Sum::new();
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    let args = SumArgs {
        parts: &stacked,
        into: &target,
    };
    sum.record(&gpu, &mut enc, &args).unwrap();
    gpu.queue.submit([enc.finish()]);
    let got = target.to_f32(&gpu).block_on().unwrap();
    for (i, g) in got.iter().enumerate() {
        assert_eq!(*g, into[i] + 1.0, "element {i}");
    }
}

#[test]
fn a_sum_refuses_parts_of_another_shape_or_type_and_writes_nothing() {
    let gpu = gpu();
    let f = Scalar::F32;
    let target = Tensor::from_f32(&gpu, &[4, 4], f, &[5.0; 16]).unwrap();
    let wrong_shape = Tensor::zeros(&gpu, &[2, 4, 3], f).unwrap();
    let wrong_type = Tensor::zeros(&gpu, &[2, 4, 4], Scalar::F16).unwrap();
    let flat = Tensor::zeros(&gpu, &[16], f).unwrap();
    let mut sum = Sum::new();
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    for (what, parts) in [
        ("parts of another shape", &wrong_shape),
        ("f16 parts", &wrong_type),
        ("parts without their own axis", &flat),
    ] {
        let args = SumArgs {
            parts,
            into: &target,
        };
        let e = sum.record(&gpu, &mut enc, &args);
        assert!(e.is_err(), "{what} was accepted");
    }
    gpu.queue.submit([enc.finish()]);
    wait(&gpu);
    assert_eq!(target.to_f32(&gpu).block_on().unwrap(), vec![5.0; 16]);
}

/// Two devices of `Gpu::several` (on one adapter here) are apart: a tensor of one given to
/// the other's op is refused naming it, and nothing is recorded.
#[test]
fn several_devices_are_apart_and_none_is_none() {
    let gpus = Gpu::several(2, kernels::FAMILY.iter().copied())
        .block_on()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(gpus.len(), 2);
    let f = Scalar::F32;
    let parts = Tensor::zeros(&gpus[0], &[2, 4], f).unwrap();
    let into = Tensor::zeros(&gpus[1], &[4], f).unwrap();
    let mut sum = Sum::new();
    let mut enc = gpus[1].device.create_command_encoder(&Default::default());
    let args = SumArgs {
        parts: &parts,
        into: &into,
    };
    let e = sum
        .record(&gpus[1], &mut enc, &args)
        .unwrap_err()
        .to_string();
    assert!(e.contains("parts"), "{e}");
    gpus[1].queue.submit([enc.finish()]);
    wait(&gpus[1]);
    let none = Gpu::several(0, kernels::FAMILY.iter().copied()).block_on();
    assert!(none.unwrap().is_empty());
}
