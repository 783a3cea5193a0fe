// The keyed Gumbel noise of `keyed_noise.rs`, operation for operation: the same SplitMix64
// hash, the same uniform, and the same logarithm from correctly rounded f64 operations in
// the same order (explicit `__d*_rn` intrinsics, so the compiler fuses none into an FMA),
// so each noise value has the host's bits.
__device__ __forceinline__ unsigned long long seedbar_mix(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ double seedbar_ln(double x) {
  const double odd_reciprocals[11] = {
      1.0,
      0.3333333333333333,
      0.2,
      0.14285714285714285,
      0.1111111111111111,
      0.09090909090909091,
      0.07692307692307693,
      0.06666666666666667,
      0.058823529411764705,
      0.05263157894736842,
      0.047619047619047616};
  const unsigned long long bits = static_cast<unsigned long long>(__double_as_longlong(x));
  long long exponent = static_cast<long long>((bits >> 52) & 0x7ffull) - 1023;
  double m = __longlong_as_double(
      static_cast<long long>((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull));
  if (m > 1.4142135623730951) {
    m = __dmul_rn(m, 0.5);
    exponent += 1;
  }
  const double f = __dsub_rn(m, 1.0);
  const double s = __ddiv_rn(f, __dadd_rn(2.0, f));
  const double z = __dmul_rn(s, s);
  double series = odd_reciprocals[10];
#pragma unroll
  for (int k = 9; k >= 0; --k) {
    series = __dadd_rn(__dmul_rn(series, z), odd_reciprocals[k]);
  }
  const double e = static_cast<double>(exponent);
  return __dadd_rn(
      __dmul_rn(e, 0.6931471803691238),
      __dadd_rn(__dmul_rn(e, 1.9082149292705877e-10), __dmul_rn(__dmul_rn(2.0, s), series)));
}

__device__ __forceinline__ float seedbar_gumbel(unsigned long long key, unsigned long long index) {
  const unsigned long long bits = seedbar_mix(key ^ (index * 0x9e3779b97f4a7c15ull)) >> 11;
  const double u = __ddiv_rn(__dadd_rn(__ull2double_rn(bits), 0.5), 9007199254740992.0);
  return __double2float_rn(-seedbar_ln(-seedbar_ln(u)));
}
