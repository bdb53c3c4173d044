# install(EXPORT) so that other CMake projects can find_package(Starling) and link
# starling::starling, and starling::torch (the libtorch layers) when built with libtorch.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set(STARLING_EXPORTED starling starling_defs)
set(STARLING_HAS_TORCH OFF)
if(TARGET starling_torch)
  set_target_properties(starling_torch PROPERTIES EXPORT_NAME torch)
  list(APPEND STARLING_EXPORTED starling_torch)
  set(STARLING_HAS_TORCH ON)
endif()
install(TARGETS ${STARLING_EXPORTED} EXPORT StarlingTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/starling DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${CMAKE_BINARY_DIR}/generated/starling DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(EXPORT StarlingTargets NAMESPACE starling:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Starling)
configure_package_config_file(cmake/StarlingConfig.cmake.in
  ${CMAKE_BINARY_DIR}/StarlingConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Starling)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/StarlingConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/StarlingConfig.cmake ${CMAKE_BINARY_DIR}/StarlingConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Starling)
