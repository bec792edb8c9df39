"""symm_comm: symmetric memory and expert-granular EP dispatch/combine over NVLink."""
