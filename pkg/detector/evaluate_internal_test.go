package detector

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// selectPercentile gives what percentile of the sorted values gives, for
// any length, duplicates, runs already in order and reversed ones.
func TestSelectPercentileMatchesTheSortedPercentile(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	gens := map[string]func(n int) []float64{
		"random": func(n int) []float64 {
			xs := make([]float64, n)
			for i := range xs {
				xs[i] = rng.Float64()
			}
			return xs
		},
		"few values": func(n int) []float64 {
			xs := make([]float64, n)
			for i := range xs {
				xs[i] = float64(rng.IntN(3))
			}
			return xs
		},
		"sorted": func(n int) []float64 {
			xs := make([]float64, n)
			for i := range xs {
				xs[i] = float64(i)
			}
			return xs
		},
		"reversed": func(n int) []float64 {
			xs := make([]float64, n)
			for i := range xs {
				xs[i] = float64(n - i)
			}
			return xs
		},
	}
	for name, gen := range gens {
		for _, n := range []int{1, 2, 3, 7, 64, 1000} {
			for _, p := range []float64{0, 0.01, 0.5, 0.95, 0.99, 1} {
				xs := gen(n)
				sorted := slices.Clone(xs)
				slices.Sort(sorted)
				require.Equal(t, percentile(sorted, p), selectPercentile(xs, p), "%s n=%d p=%v", name, n, p)
			}
		}
	}
	require.Zero(t, selectPercentile(nil, 0.5))
}
