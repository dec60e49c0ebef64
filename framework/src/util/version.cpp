#include <ddp/config.h>

namespace ddp {

const char* version() { return DDP_VERSION; }

}  // namespace ddp
