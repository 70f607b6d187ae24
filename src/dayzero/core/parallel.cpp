#include "dayzero/core/parallel.h"

#include <omp.h>

namespace dz {

int default_num_threads() { return omp_get_max_threads(); }

}  // namespace dz
