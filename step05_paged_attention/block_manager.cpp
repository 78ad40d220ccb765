#include "step05_paged_attention/block_manager.hpp"
